"""`dattn bench`: the sweep table with per-implementation limits (the regression gate renders as dattn compare)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from .common import heads_label, size

if TYPE_CHECKING:
    from ...bench import SweepResult


def _title(rows: list) -> str:
    title = "dattn bench"
    if rows:
        r = rows[0]
        distributed = any(row.world_size > 1 for row in rows)
        title += (
            f" ({escape(r.mode)}, {escape(r.dtype)}, {escape(r.device)}, "
            f"B={r.batch} {heads_label(r.heads, r.kv_heads)} D={r.head_dim}"
            + (
                f", {r.world_size} ranks: time of the slowest rank, memory and bytes of the largest rank"
                if distributed
                else ""
            )
            + ("; lines timed round-robin (--interleave)" if any(row.interleaved for row in rows) else "")
            + "; time = median of the timed calls, +- its 95% CI; TFLOP/s counts attended pairs only)"
        )
    return title


def _cells(r, ratio: float | None, columns: tuple[bool, bool, bool]) -> list[str]:
    patterned, distributed, ratioed = columns
    pattern_cells = [escape(r.pattern or "-"), f"{r.element_density:.3f}" if r.element_density is not None else "-"]
    cells = [
        escape(r.impl),
        *(pattern_cells if patterned else []),
        f"{r.seq_len:,}",
        f"{r.time_ms:.1f}" if r.time_ms is not None else "-",
        f"{r.median_ci_pct:.1f}%" if r.median_ci_pct is not None else "-",
        *([f"{ratio:.2f}" if ratio is not None else "-"] if ratioed else []),
        f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "-",
        f"{r.tflops:.3f}" if r.tflops is not None else "-",
        size(r.peak_mem_bytes),
    ]
    if distributed:
        cells += [size(r.comm_bytes_sent), size(r.comm_bytes_received)]
    if r.status == "ok":
        status = f"[yellow]ok, noisy:[/] {escape(r.noisy_reason or '')}" if r.noisy else "[green]ok[/]"
    else:
        status = f"[yellow]{r.status}[/] " + escape(f"{r.reason or ''} {r.error or ''}".strip())
    return [*cells, status]


def bench_table(result: SweepResult) -> Table:
    """One row per point; time also as a ratio to the first dense baseline of the sweep ("x sdpa") at the
    same N; then one row per measured line saying how far it got and what stopped it."""
    from ...bench.summary import time_ratios

    rows = result.rows
    base, ratios = time_ratios(rows)
    shape = (any(r.pattern for r in rows), any(r.world_size > 1 for r in rows), base is not None)
    patterned, distributed, _ = shape
    table = Table(title=_title(rows))
    columns = (
        ["impl"]
        + (["pattern", "density"] if patterned else [])
        + ["N", "time ms", "+-"]
        + ([f"x {base}"] if base else [])
        + ["tokens/s", "TFLOP/s", "peak mem"]
        + (["sent/call", "recv/call"] if distributed else [])
        + ["status"]
    )
    for col in columns:
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col == "status" else "right", no_wrap=col != "status")
    for r, ratio in zip(rows, ratios):
        table.add_row(*_cells(r, ratio, shape))
    for s in result.summaries:
        table.add_section()
        lead = [escape(s.impl)] + ([escape(s.pattern or "-"), ""] if patterned else [])
        table.add_row(*lead, *[""] * (len(columns) - len(lead) - 1), escape(s.summary))
    return table


def scaling_lines(result: SweepResult) -> list[str]:
    """The fitted exponents per measured line, printed under the table: 'impl: time ~ N^1.02, memory ~ N^1.00'."""
    fits = {
        f"{s.impl} {s.pattern}" if s.pattern else s.impl: {"time": s.time_exponent, "memory": s.memory_exponent}
        for s in result.summaries
    }
    lines = exponent_lines(fits)
    return (
        ["scaling, least-squares fit over the lengths that ran ok:", *[f"  {line}" for line in lines]] if lines else []
    )


def point_line(row) -> str:
    """A measured point as a progress line: 'ImprovedDilatedAttention N=8,192 ok 112 ms'."""
    what = f" {row.pattern}" if row.pattern else ""
    text = f"{row.impl}{what} N={row.seq_len:,} {row.status}"
    if row.status == "ok" and row.time_ms is not None:
        return f"{text} {_ms(row.time_ms)} ms"
    return f"{text}: {row.reason}" if row.reason else text


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def exponent_lines(exponents: dict[str, dict[str, float | None]]) -> list[str]:
    """'impl: time ~ N^1.02, memory ~ N^1.00' per implementation with a fit."""
    lines = []
    for name, fits in exponents.items():
        parts = [f"{q} ~ N^{v:.2f}" for q, v in fits.items() if v is not None]
        if parts:
            lines.append(f"{name}: " + ", ".join(parts))
    return lines
