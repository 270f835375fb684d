"""Bench table, scaling fits and plots."""

import math
import re

import pytest

from dattn_cli.bench import fit_exponent, plot_rows
from dattn_cli.workload import Problem
from dattn_cli.workload.records import BenchRow, row_fields

KEY = {
    k: v
    for k, v in row_fields(
        Problem(impl="sdpa", seq_len=1, heads=2, head_dim=16, segment_lengths=[64], dilation_rates=[1])
    ).items()
    if k not in ("impl", "seq_len")
}


def row(impl, n, ms, status="ok", mem=None):
    return BenchRow(
        impl=impl, seq_len=n, status=status, time_ms=ms if status == "ok" else None, peak_mem_bytes=mem, **KEY
    )


def test_fit_exponent():
    xs = [1024, 2048, 4096, 8192]
    assert fit_exponent(xs, [x**1.0 * 3 for x in xs]) == pytest.approx(1.0)
    assert fit_exponent(xs, [x**2 for x in xs]) == pytest.approx(2.0)
    assert fit_exponent([1024], [1.0]) is None


def test_plot_writes_png_with_exponents(tmp_path):
    rows = [row("linear", n, n / 100, mem=1000 * n) for n in (1024, 2048, 4096, 8192)]
    rows += [row("quadratic", n, n * n / 1e6, mem=n * n) for n in (1024, 2048, 4096)]
    rows.append(row("quadratic", 8192, None, status="oom"))
    path = tmp_path / "p.png"
    exponents = plot_rows(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert math.isclose(exponents["linear"]["memory"], 1.0) and math.isclose(exponents["quadratic"]["time"], 2.0)


def rendered(result) -> str:
    import io

    from rich.console import Console

    from dattn_cli.cli.render.bench import bench_table

    console = Console(file=io.StringIO(), width=250)
    console.print(bench_table(result))
    return console.file.getvalue()


def test_times_as_ratios_to_the_first_dense_baseline_of_the_sweep():
    from dattn_cli.bench.summary import time_ratios

    rows = [
        row("ImprovedDilatedAttention", 1024, 2.0),
        row("ImprovedDilatedAttention", 2048, 3.0),
        row("ImprovedDilatedAttention", 4096, 5.0),
        row("math", 1024, 40.0),
        row("sdpa", 1024, 20.0),
        row("sdpa", 2048, 30.0),
        row("sdpa", 4096, None, status="oom"),
    ]
    base, ratios = time_ratios(rows)
    assert base == "math"  # the first dense baseline in sweep order, not the fastest one
    assert ratios[:4] == [pytest.approx(0.05), None, None, pytest.approx(1.0)]
    base, ratios = time_ratios(rows[:3] + rows[4:])
    assert base == "sdpa" and ratios == [pytest.approx(0.1), pytest.approx(0.1), None, 1.0, 1.0, None]
    assert time_ratios([row("ImprovedDilatedAttention", 1024, 2.0), row("reference", 1024, 9.0)]) == (
        None,
        [None, None],
    )


def test_table_has_the_ratio_column_and_each_line_s_sentence():
    from dattn_cli.bench import ImplSummary, SweepResult
    from dattn_cli.bench.summary import summarize

    rows = [
        row("ImprovedDilatedAttention", 1024, 2.0),
        row("ImprovedDilatedAttention", 2048, 3.0),
        row("sdpa", 1024, 20.0),
        row("sdpa", 2048, None, status="skipped"),
    ]
    rows[3].reason = "time: one call took 9.00 s, so 3 repeats would exceed --max-seconds 10"
    summaries = [ImplSummary(impl="ImprovedDilatedAttention", max_ok_seq_len=2048), summarize("sdpa", 1024, rows[3])]
    text = rendered(SweepResult(rows=rows, summaries=summaries))
    assert "x sdpa" in text
    cells = [
        [c.strip() for i, c in enumerate(line.split("│")[1:6]) if i != 3] for line in text.splitlines() if "│" in line
    ]
    assert ["ImprovedDilatedAttention", "1,024", "2.0", "0.10"] in cells and ["sdpa", "2,048", "-", "-"] in cells
    assert "max N 2,048; all ok" in text
    assert "max N 1,024; stopped by --max-seconds at N=2,048, not by memory" in text
    assert re.search(r"time ms ┃\s+\+- ┃ x sdpa ┃ tokens/s", text), text
    assert re.search(
        r"time ms ┃\s+\+- ┃ tokens/s", rendered(SweepResult(rows=rows[:2], summaries=summaries[:1]))
    )  # no dense baseline


def test_scaling_lines_and_progress_lines():
    from dattn_cli.bench import ImplSummary, SweepResult
    from dattn_cli.cli.render.bench import point_line, scaling_lines

    summaries = [
        ImplSummary(impl="ImprovedDilatedAttention", max_ok_seq_len=8192, time_exponent=1.02, memory_exponent=0.998),
        ImplSummary(impl="sdpa", max_ok_seq_len=1024),
    ]
    lines = scaling_lines(SweepResult(rows=[], summaries=summaries))
    assert lines[1:] == ["  ImprovedDilatedAttention: time ~ N^1.02, memory ~ N^1.00"]  # sdpa: one length, no fit
    assert scaling_lines(SweepResult(rows=[], summaries=summaries[1:])) == []
    ok = row("ImprovedDilatedAttention", 8192, 112.4)
    assert point_line(ok) == "ImprovedDilatedAttention N=8,192 ok 112 ms"
    failed = row("sdpa", 16384, None, status="oom")
    failed.reason = "out of memory"
    assert point_line(failed) == "sdpa N=16,384 oom: out of memory"
