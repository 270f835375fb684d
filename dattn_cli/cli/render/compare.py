"""`dattn compare`: one line per matched point (medians, ratio with its 95% CI, p-value, verdict) and the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import literal, note, stdout

if TYPE_CHECKING:
    from ...compare import CompareReport

COLOURS = {"faster": "green", "slower": "red", "same": "white", "inconclusive": "yellow"}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def point_cells(p) -> list[str]:
    """impl, N, mode, base ms, new ms, ratio, 95% CI, p: one compared point as text (table and Markdown)."""
    impl = p.impl if p.impl == p.impl_base else f"{p.impl} / {p.impl_base}"
    return [
        impl,
        f"{p.seq_len:,}",
        p.mode,
        ms(p.base_ms),
        ms(p.new_ms),
        "-" if p.ratio is None else f"{p.ratio:.3f}",
        "-" if p.ci_low is None else f"{p.ci_low:.3f}-{p.ci_high:.3f}",
        "-" if p.p_value is None else f"{p.p_value:.2g}",
    ]


def shared_note(report: CompareReport) -> str | None:
    """The note every point carries (e.g. an older report without samples), said once under the table."""
    notes = {p.note for p in report.points}
    return notes.pop() if len(notes) == 1 else None


def compare_table(report: CompareReport, labels: tuple[str, str]) -> Table:
    base, new = labels
    table = Table(title=f"dattn compare: {new} / {base} (threshold {report.threshold_pct:g}%, alpha {report.alpha:g})")
    columns = ["impl", "N", "mode", f"{base} ms", f"{new} ms", "ratio", "95% CI", "p", "n", "verdict"]
    per_point = len({p.note for p in report.points}) > 1
    for column in columns + ["note"] * per_point:
        table.add_column(
            column, justify="right" if column in ("N", "ratio", "p", "n") or column.endswith(" ms") else "left"
        )
    for p in report.points:
        impl, *cells = point_cells(p)
        table.add_row(
            literal(impl),
            *cells,
            f"{p.n_base}/{p.n_new}",
            f"[{COLOURS[p.verdict]}]{p.verdict}[/]",
            *([literal(p.note or "")] if per_point else []),
        )
    return table


def compare_summary(report: CompareReport) -> str:
    counts = {v: sum(p.verdict == v for p in report.points) for v in COLOURS}
    spread = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return f"[{COLOURS[report.verdict]}]verdict: {report.verdict}[/] ({spread} of {len(report.points)} points)"


def show_report(report: CompareReport, labels: tuple[str, str], title: str = "") -> None:
    """The table, the note every point shares, the warnings (stderr) and the verdict line: dattn compare's
    output, and bench's regression gate."""
    stdout.print(compare_table(report, labels))
    if shared_note(report):
        note(f"note (every point): {shared_note(report)}")
    for line in report.warnings:
        note(f"warning: {line}", style="yellow")
    stdout.print(title + compare_summary(report))
