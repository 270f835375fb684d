"""Regression gate and plot."""

import math

import pytest

from dattn_cli.bench import find_regressions, fit_exponent, plot_rows
from dattn_cli.workload import Problem
from dattn_cli.workload.records import BenchRow, row_fields

KEY = {k: v for k, v in row_fields(Problem(impl="sdpa", seq_len=1, heads=2, head_dim=16, segment_lengths=[64],
                                            dilation_rates=[1])).items() if k not in ("impl", "seq_len")}


def row(impl, n, ms, status="ok", mem=None):
    return BenchRow(impl=impl, seq_len=n, status=status, time_ms=ms if status == "ok" else None,
                    peak_mem_bytes=mem, **KEY)


def test_regression_gate():
    baseline = [row("a", 1024, 10.0), row("a", 2048, 20.0), row("b", 1024, 5.0)]
    current = [row("a", 1024, 10.5), row("a", 2048, 23.0), row("b", 1024, 5.0), row("c", 1024, 1.0)]
    found, matched = find_regressions(current, baseline, 10)
    assert matched == 3
    assert [(r.impl, r.seq_len) for r in found] == [("a", 2048)] and found[0].change_pct == pytest.approx(15.0)
    assert find_regressions(current, baseline, 20)[0] == []
    with pytest.raises(ValueError, match="--fail-on-regression"):
        find_regressions(current, baseline, -1)


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
