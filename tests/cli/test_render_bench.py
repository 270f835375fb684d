"""The bench table in an 80-column log: implementation names whole, status cells a few words, the reasons as
numbered footnotes under the table, and the derived columns left out (and said so) only where they do not fit."""

import io

from rich.console import Console

from dattn_cli.bench import ImplSummary, SweepResult
from dattn_cli.bench.summary import summarize
from dattn_cli.cli.render.bench import bench_table
from dattn_cli.workload import Problem
from dattn_cli.workload.records import BenchRow, row_fields

CONTENTION = (
    "other processes kept 1.9 of 2 CPUs busy while this point ran its 1 torch thread, so its timings and ratios "
    "are not trustworthy: rerun on a quiet machine or with fewer --threads"
)
SPREAD = "relative IQR 12% of the median, over 10%: other load or unsettled timings"
STOPPED = "stopped by max-seconds after 10 samples with the median known to +-13.7%, not --precision 3%"
SKIPPED = "time: one call took 2.95 s; with 1 timed call and 2 untimed the point would take about 12.0 s"


def row(impl: str, n: int, ms: float | None, noisy: list[str] | None = None, status: str = "ok", **fields) -> BenchRow:
    problem = Problem(impl=impl, seq_len=n, heads=8, head_dim=64, segment_lengths=[2048], dilation_rates=[1])
    values = {"time_ms": ms, "median_ci_pct": 13.7, "tokens_per_s": n / ms * 1e3, "tflops": 0.007} if ms else {}
    return BenchRow(
        **row_fields(problem),
        status=status,
        peak_mem_bytes=120 * 2**20 if ms else None,
        noisy=bool(noisy),
        noisy_reason="; ".join(noisy) if noisy else None,
        **values,
        **fields,
    )


def quick_result() -> SweepResult:
    """The rows of a `dattn bench --quick` on a loaded machine: every point noisy, sdpa skipped at 4k."""
    impls, lengths = ("DilatedAttention", "ImprovedDilatedAttention"), (2048, 4096, 8192)
    rows = [row(impl, n, 500.0 * n / 2048, [SPREAD, CONTENTION, STOPPED]) for impl in impls for n in lengths]
    rows += [row("sdpa", 2048, 689.0, [CONTENTION]), row("sdpa", 4096, None, status="skipped", reason=SKIPPED)]
    summaries = [
        ImplSummary(impl="DilatedAttention", max_ok_seq_len=8192),
        ImplSummary(impl="ImprovedDilatedAttention", max_ok_seq_len=8192),
        summarize("sdpa", 2048, rows[-1]),
    ]
    return SweepResult(rows=rows, summaries=summaries)


def render(result: SweepResult, width: int) -> str:
    console = Console(file=io.StringIO(), width=width)
    console.print(bench_table(result))
    return console.file.getvalue()


def body(text: str) -> list[str]:
    """The table's row lines: after the header's rule, before the legend."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.strip()) <= set("━╇┡┩─"))
    end = next(i for i, line in enumerate(lines) if line.startswith(("└", "time = median")))
    return lines[start + 1 : end]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("│ ").split("│")] if "│" in line else line.split()


def test_an_80_column_log_keeps_names_whole_and_reasons_below_the_table():
    text = render(quick_result(), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    rows = body(text)
    assert len(rows) == 8, text  # one line per point: no cell wraps
    names = [cells(line)[0] for line in rows]
    assert names == ["DilatedAttention"] * 3 + ["ImprovedDilatedAttention"] * 3 + ["sdpa"] * 2
    statuses = [" ".join(cells(line)[-2:]) for line in rows]
    assert statuses[:6] == ["noisy [1,2,3]"] * 6 and statuses[6:] == ["noisy [2]", "skipped [4]"], statuses
    footnotes = [line for line in lines if line.startswith("[")]
    assert [f[:4] for f in footnotes] == ["[1] ", "[2] ", "[3] ", "[4] "]
    assert footnotes[0] == f"[1] {SPREAD}" and CONTENTION.startswith(footnotes[1][4:])
    assert "left out at this width: tokens/s, TFLOP/s" in text and "tokens/s" not in lines[1]
    assert "sdpa: max N 2,048; stopped by --max-seconds at N=4,096, not by memory" in text


def test_a_wide_log_has_every_column_and_the_borders():
    text = render(quick_result(), 120)
    assert max(len(line) for line in text.splitlines()) <= 120
    header = next(line for line in text.splitlines() if "time ms" in line)
    assert all(name in header for name in ("┃ impl", "tokens/s", "TFLOP/s", "x sdpa", "peak mem", "status"))
    rows = body(text)
    assert "left out" not in text and len(rows) == 8 and cells(rows[3])[0] == "ImprovedDilatedAttention"
    assert cells(rows[3])[-1] == "noisy [1,2,3]"


def test_reason_text_is_printed_literally():
    result = SweepResult(rows=[row("sdpa", 2048, None, status="error", reason="[/bold] not markup")], summaries=[])
    text = render(result, 80)
    assert "[1] [/bold] not markup" in text and cells(body(text)[0])[-2:] == ["error", "[1]"]
