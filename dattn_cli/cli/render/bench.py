"""`dattn bench`: the sweep table, readable at 80 columns, with per-implementation limits and the reasons as
footnotes (the regression gate renders as dattn compare)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .common import heads_label, size

if TYPE_CHECKING:
    from ...bench import SweepResult


def _title(rows: list) -> str:
    if not rows:
        return "dattn bench"
    r = rows[0]
    shape = f"{escape(r.mode)}, {escape(r.dtype)}, {escape(r.device)}, B={r.batch}"
    return f"dattn bench ({shape} {heads_label(r.heads, r.kv_heads)} D={r.head_dim})"


def _legend(rows: list) -> list[str]:
    """What the columns mean, printed under the table (a title this long would wrap inside it)."""
    lines = ["time = median of the timed calls, +- its 95% CI; TFLOP/s counts attended pairs only"]
    if any(row.world_size > 1 for row in rows):
        lines.append(f"{rows[0].world_size} ranks: time of the slowest rank, memory and bytes of the largest rank")
    if any(row.interleaved for row in rows):
        lines.append("lines timed round-robin (--interleave)")
    return lines


class Notes:
    """Footnotes: each distinct reason (a row's noisy reasons, a failure's reason and error) numbered once, in
    the order the rows first give it; the row's status cell names the numbers."""

    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def mark(self, reasons: list[str]) -> str:
        numbers = [self.texts.setdefault(text, len(self.texts) + 1) for text in reasons if text]
        return f" [{','.join(map(str, numbers))}]" if numbers else ""

    def lines(self) -> list[str]:
        return [f"[{n}] {text}" for text, n in self.texts.items()]


def _status(r, notes: Notes) -> str:
    if r.status == "ok":
        if not r.noisy:
            return "[green]ok[/]"
        return "[yellow]noisy[/]" + notes.mark((r.noisy_reason or "").split("; "))
    return f"[yellow]{escape(r.status)}[/]" + notes.mark([f"{r.reason or ''} {r.error or ''}".strip()])


def _cells(r, ratio: float | None, columns: list[str], notes: Notes) -> list[str]:
    values = {
        "impl": escape(r.impl),
        "pattern": escape(r.pattern or "-"),
        "density": f"{r.element_density:.3f}" if r.element_density is not None else "-",
        "N": f"{r.seq_len:,}",
        "time ms": f"{r.time_ms:.1f}" if r.time_ms is not None else "-",
        "+-": f"{r.median_ci_pct:.1f}%" if r.median_ci_pct is not None else "-",
        "ratio": f"{ratio:.2f}" if ratio is not None else "-",
        "tokens/s": f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "-",
        "TFLOP/s": f"{r.tflops:.3f}" if r.tflops is not None else "-",
        "peak mem": size(r.peak_mem_bytes),
        "sent/call": size(r.comm_bytes_sent),
        "recv/call": size(r.comm_bytes_received),
        "rank max/mean": f"{r.rank_time_max_over_mean:.2f}" if r.rank_time_max_over_mean is not None else "-",
    }
    return [_status(r, notes) if col == "status" else values[col] for col in columns]


LEAVE_OUT = ("tokens/s", "TFLOP/s", "ratio")  # in this order where the console is too narrow for the table even
# without its borders: each derives from the time, and every field stays in the --out, --json and --csv records


class BenchTable:
    """One row per point (time also as a ratio to the first dense baseline of the sweep, "x sdpa", at the same N),
    with a status of a word or two whose reasons are numbered footnotes under the table; then the legend, one line
    per measured line saying how far it got and what stopped it, and the footnotes. Implementation names are
    never broken: where the console is narrower than the table, the table drops its borders, then LEAVE_OUT's
    columns, and a line says which."""

    def __init__(self, result: SweepResult):
        from ...bench.summary import time_ratios

        self.result = result
        self.base, self.ratios = time_ratios(result.rows)

    def columns(self, left_out: tuple[str, ...] = ()) -> list[str]:
        rows = self.result.rows
        columns = (
            ["impl"]
            + (["pattern", "density"] if any(r.pattern for r in rows) else [])
            + ["N", "time ms", "+-"]
            + (["ratio"] if self.base else [])
            + ["tokens/s", "TFLOP/s", "peak mem"]
            + (["sent/call", "recv/call", "rank max/mean"] if any(r.world_size > 1 for r in rows) else [])
            + ["status"]
        )
        return [c for c in columns if c not in left_out]

    def table(self, left_out: tuple[str, ...] = (), compact: bool = False) -> tuple[Table, Notes]:
        rows, notes = self.result.rows, Notes()
        style = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0)) if compact else {}
        table = Table(title=_title(rows), **style)
        columns = self.columns(left_out)
        for col in columns:
            header = f"x {self.base}" if col == "ratio" else col
            table.add_column(header, justify="left" if col in ("impl", "status") else "right", no_wrap=True)
        for r, ratio in zip(rows, self.ratios):
            table.add_row(*_cells(r, ratio, columns, notes))
        return table, notes

    def fitting(self, console: Console, width: int) -> tuple[Table, Notes, tuple[str, ...]]:
        """The fullest table whose natural width fits `width` (the last try, however wide, if none does)."""
        leave = [LEAVE_OUT[:k] for k in range(len(LEAVE_OUT) + 1) if all(c in self.columns() for c in LEAVE_OUT[:k])]
        tries = [((), False)] + [(left_out, True) for left_out in leave]
        for left_out, compact in tries:
            table, notes = self.table(left_out, compact)
            natural = Measurement.get(console, console.options.update_width(10 * width + 1000), table).maximum
            if natural <= width:
                break
        return table, notes, left_out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, notes, left_out = self.fitting(console, options.max_width)
        yield table
        lines = _legend(self.result.rows)
        if left_out:
            names = ", ".join(f"x {self.base}" if c == "ratio" else c for c in left_out)
            lines.append(f"left out at this width: {names} (in the --out, --json and --csv records)")
        lines += [f"{s.impl}{f' {s.pattern}' if s.pattern else ''}: {s.summary}" for s in self.result.summaries]
        lines += notes.lines()
        yield from (Text(line) for line in lines)


bench_table = BenchTable  # the sweep's table, its legend, each line's sentence and the footnotes


def scaling_lines(result: SweepResult) -> list[str]:
    """The fitted exponents per measured line, printed under the table: 'impl: time ~ N^1.02, memory ~ N^1.00'."""
    fits = {
        f"{s.impl} {s.pattern}" if s.pattern else s.impl: {"time": s.time_exponent, "memory": s.memory_exponent}
        for s in result.summaries
    }
    parts = {name: [f"{q} ~ N^{v:.2f}" for q, v in fit.items() if v is not None] for name, fit in fits.items()}
    lines = [f"  {name}: " + ", ".join(found) for name, found in parts.items() if found]
    return ["scaling, least-squares fit over the lengths that ran ok:", *lines] if lines else []


def point_line(row) -> str:
    """A measured point as a progress line: 'ImprovedDilatedAttention N=8,192 ok 112 ms'."""
    what = f" {row.pattern}" if row.pattern else ""
    text = f"{row.impl}{what} N={row.seq_len:,} {row.status}"
    if row.status == "ok" and row.time_ms is not None:
        return f"{text} {_ms(row.time_ms)} ms"
    return f"{text}: {row.reason}" if row.reason else text


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
