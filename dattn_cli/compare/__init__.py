"""`dattn compare` as a library: are two bench runs, or two implementations in one run, different in speed?

Modules: stats.py (sample statistics, the ratio and its CI, the test and the verdict rule), match.py
(which points are the same measurement; whether two runs' environments are comparable), report.py (the
per-point comparison, the report and its exit code). Everything returns pydantic models; bad input
(a missing or damaged report, samples that are not times, nothing that matches, an unknown --a/--b,
a negative threshold) raises ValueError with one sentence naming it.

How the CLI uses this
---------------------
* `dattn compare BASE.jsonl NEW.jsonl --threshold PCT`: `report = compare_reports(BASE, NEW, PCT)`; render
  `report.points` as a table (impl, N, mode, base_ms, new_ms, ratio, ci_low-ci_high, p_value, verdict,
  note) and `report.warnings` as notes; `--json FILE` writes `report.model_dump(include={"points",
  "verdict", "warnings"})` (or the whole dump); exit `report.exit_code()` (0, 1, 3). A ValueError is the
  usual one line and exit 2.
* `dattn compare RUN.jsonl --a IMPL --b IMPL`: `compare_impls(RUN, A, B, PCT)`; ratio = A/B, 'slower'
  means A is slower than B.
* `bench --baseline FILE --fail-on-regression PCT`: the baseline is read before the sweep (`load_report`), and
  after it `compare_rows(baseline, result.rows, PCT, environment=result.environment)`; bench exits with
  `exit_code()`: 1 on an established regression, 3 when the comparison is inconclusive.
"""

from __future__ import annotations

from pathlib import Path

from ..workload.records import BenchRow
from .match import (
    Loaded as Loaded,
    environment_warnings,
    load_report as load_report,
    match_impls,
    match_reports,
    missing_environment,
    side_of,
)
from .report import ComparePoint as ComparePoint, CompareReport as CompareReport, build_report
from .stats import band

DEFAULT_THRESHOLD_PCT = 10.0  # identical runs here differ by ~5% per point (benchmarks/RESULTS.md, noise)


def compare_reports(
    base: Path | str, new: Path | str, threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = 0.05
) -> CompareReport:
    """NEW's points against BASE's, matched by configuration; ratio = NEW / BASE."""
    band(threshold_pct)  # a bad threshold is refused before the files are read
    old, now = load_report(base, "BASE"), load_report(new, "NEW")
    pairs, warnings = match_reports(old.points, now.points)
    environment = environment_warnings(old.environments, now.environments, pairs)
    notes = warnings + missing_environment(old.environments, now.environments)
    return build_report(pairs, notes, environment, threshold_pct, alpha)


def compare_impls(
    run: Path | str, impl_a: str, impl_b: str, threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = 0.05
) -> CompareReport:
    """Implementation A against B in one report, point by point; ratio = A / B. One run shares one
    environment, so none is compared."""
    band(threshold_pct)
    pairs, warnings = match_impls(load_report(run, "RUN").points, impl_a, impl_b)
    return build_report(pairs, warnings, [], threshold_pct, alpha)


def compare_rows(
    baseline: Loaded | Path | str,
    rows: list[BenchRow],
    threshold_pct: float,
    alpha: float = 0.05,
    environment: dict | None = None,
) -> CompareReport:
    """This run's `rows` (NEW) against the report `baseline` (BASE, a path or the report load_report read):
    bench --baseline. `environment` is this run's environment record (None: not checked)."""
    band(threshold_pct)
    old = baseline if isinstance(baseline, Loaded) else load_report(baseline, "--baseline")
    try:
        pairs, warnings = match_reports(old.points, [side_of(r, f"this run ({r.impl} N={r.seq_len:,})") for r in rows])
    except ValueError:
        raise ValueError(
            f"--baseline {old.path}: baseline has no point matching this sweep (same implementation, "
            "shape and options): compare against a report of the same sweep"
        ) from None
    differences = environment_warnings(old.environments, [environment] if environment else [], pairs)
    return build_report(pairs, warnings, differences, threshold_pct, alpha)
