"""`dattn bench`: the sweep table with per-implementation limits, and the regression gate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import size

if TYPE_CHECKING:
    from ...bench import Regression, SweepResult


def _title(rows: list) -> str:
    title = "dattn bench"
    if rows:
        r = rows[0]
        distributed = any(row.world_size > 1 for row in rows)
        title += (f" ({r.mode}, {r.dtype}, {r.device}, B={r.batch} H={r.heads} D={r.head_dim}"
                  + (f", {r.world_size} ranks: time of the slowest rank, memory and bytes of the largest rank" if distributed else "")
                  + "; time = median of repeats; TFLOP/s counts attended pairs only)")
    return title


def _cells(r, patterned: bool, distributed: bool) -> list[str]:
    pattern_cells = [r.pattern or "-", f"{r.element_density:.3f}" if r.element_density is not None else "-"]
    cells = [
        r.impl, *(pattern_cells if patterned else []), str(r.seq_len),
        f"{r.time_ms:.1f}" if r.time_ms is not None else "-",
        f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "-",
        f"{r.tflops:.3f}" if r.tflops is not None else "-",
        size(r.peak_mem_bytes),
    ]
    if distributed:
        cells += [size(r.comm_bytes_sent), size(r.comm_bytes_received)]
    status = "[green]ok[/]" if r.status == "ok" else f"[yellow]{r.status}[/] {r.reason or ''} {r.error or ''}".strip()
    return [*cells, status]


def bench_table(result: SweepResult) -> Table:
    rows = result.rows
    distributed = any(r.world_size > 1 for r in rows)
    patterned = any(r.pattern for r in rows)
    table = Table(title=_title(rows))
    columns = (["impl"] + (["pattern", "density"] if patterned else []) + ["N", "time ms", "tokens/s", "TFLOP/s", "peak mem"]
               + (["sent/call", "recv/call"] if distributed else []) + ["status"])
    for col in columns:
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col == "status" else "right", no_wrap=col != "status")
    for r in rows:
        table.add_row(*_cells(r, patterned, distributed))
    for s in result.summaries:
        table.add_section()
        blanks = [""] * (len(columns) - 3 - (2 if patterned else 0))
        lead = [s.impl] + ([s.pattern or "-", ""] if patterned else [])
        table.add_row(*lead, f"max {s.max_ok_seq_len}" if s.max_ok_seq_len else "none", *blanks, s.limit or "all ok")
    return table


def regression_table(regressions: list[Regression], matched: int, threshold: float) -> Table:
    table = Table(title=f"regression gate: {len(regressions)} of {matched} matching points slower by > {threshold:g}%")
    for col in ("impl", "N", "mode", "baseline ms", "current ms", "change"):
        table.add_column(col)
    for r in regressions:
        table.add_row(r.impl, str(r.seq_len), r.mode, f"{r.baseline_ms:.1f}", f"{r.current_ms:.1f}", f"[red]+{r.change_pct:.1f}%[/]")
    return table


def exponent_lines(exponents: dict[str, dict[str, float | None]]) -> list[str]:
    """'impl: time ~ N^1.02, memory ~ N^1.00' per implementation with a fit."""
    lines = []
    for name, fits in exponents.items():
        parts = [f"{q} ~ N^{v:.2f}" for q, v in fits.items() if v is not None]
        if parts:
            lines.append(f"{name}: " + ", ".join(parts))
    return lines
