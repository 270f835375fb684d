"""`dattn profile`: caches on vs off, one row per statistic."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.table import Table

from .common import heads_label, literal, size

if TYPE_CHECKING:
    from ...profile import ProfileReport
    from ...profile.report import SettingResult


def _title(report: ProfileReport) -> str:
    p, c = report.config.problem, report.config
    return (
        f"dattn profile {literal(p.impl)} ({p.mode}, {p.dtype}, {p.device}, B={p.batch} N={p.seq_len} "
        f"{heads_label(p.heads, p.kv_heads)} D={p.head_dim}, {c.iterations} iterations; "
        f"speed-up on/off {report.speedup_on_vs_off:.2f}x)"
    )


def _rows(on) -> list[tuple[str, Callable]]:
    rows = [
        ("time median ms (p10-p90)", lambda s: f"{s.time.median_ms:.1f} ({s.time.p10_ms:.1f}-{s.time.p90_ms:.1f})"),
        ("peak memory above baseline", lambda s: size(s.memory.peak_above_baseline_bytes)),
        ("pattern cache hits / misses", lambda s: f"{s.pattern_cache.hits} / {s.pattern_cache.misses}"),
        ("pattern cache hit rate", lambda s: f"{s.pattern_cache.hit_rate:.1%}"),
        (
            "pattern cache evictions, entries, bytes",
            lambda s: f"{s.pattern_cache.evictions}, {s.pattern_cache.entries}, {size(s.pattern_cache.bytes)}",
        ),
        ("pool requests / reuses", lambda s: f"{s.memory_pool.requests} / {s.memory_pool.reuses}"),
        ("pool reuse rate", lambda s: f"{s.memory_pool.reuse_rate:.1%}"),
        (
            "pool bytes held (peak)",
            lambda s: f"{size(s.memory_pool.bytes_held)} ({size(s.memory_pool.peak_bytes_held)})",
        ),
    ]
    if on.memory.cuda_allocator is not None:
        rows += [
            ("cuda allocated peak", lambda s: size(s.memory.cuda_allocator.allocated_bytes_all_peak)),
            ("cuda reserved peak", lambda s: size(s.memory.cuda_allocator.reserved_bytes_all_peak)),
            (
                "cuda alloc retries / OOMs",
                lambda s: f"{s.memory.cuda_allocator.num_alloc_retries} / {s.memory.cuda_allocator.num_ooms}",
            ),
        ]
    rows.append(("backend", lambda s: literal(s.backend or "-")))
    if on.block_pattern is not None:
        rows += _block_rows()
    return rows


def _block_rows() -> list[tuple[str, Callable]]:
    def get(fn):
        return lambda s: fn(s.block_pattern) if s.block_pattern else "-"

    return [
        ("block pattern", get(lambda b: literal(b.description))),
        ("density: blocks / (query, key) pairs", get(lambda b: f"{b.block_density:.4f} / {b.element_density:.4f}")),
        ("executor", get(lambda b: literal(b.executor or "-"))),
        ("block table / cached pattern bytes", get(lambda b: f"{size(b.block_table_bytes)} / {size(b.cached_bytes)}")),
    ]


def profile_table(report: ProfileReport) -> Table:
    table = Table(title=_title(report))
    table.add_column("metric")
    table.add_column("caches on", justify="right")
    table.add_column("caches off", justify="right")
    on, off = report.caches_on, report.caches_off
    for name, get in _rows(on):
        table.add_row(name, get(on), get(off))
    table.caption = literal(
        f"memory: {on.memory.memory_method}" + (f"; trace: {report.trace_path}" if report.trace_path else "")
    )
    return table


def setting_line(report: ProfileReport, setting: SettingResult) -> str:
    """One measured setting, for progress: "ImprovedDilatedAttention N=8,192 caches on ok 112.0 ms"."""
    p = report.config.problem
    name = "caches on" if setting.use_pattern_cache else "caches off"
    return f"{p.impl} N={p.seq_len:,} {name} ok {setting.time.median_ms:.1f} ms"


def pattern_title(report: ProfileReport) -> str:
    """Title of the --show-pattern PNG."""
    p, bp = report.config.problem, report.block_pattern
    return (
        f"{p.impl}\n{bp.description}, N={p.seq_len}{' causal' if p.causal else ''}; "
        f"block density {bp.block_density:.3f}"
    )
