"""The regression gate: the same points, median against median."""

from __future__ import annotations

import math

from pydantic import BaseModel

from ..workload.records import BenchRow


class Regression(BaseModel):
    impl: str
    seq_len: int
    mode: str
    baseline_ms: float
    current_ms: float
    change_pct: float


def find_regressions(current: list[BenchRow], baseline: list[BenchRow], threshold_pct: float) -> tuple[list[Regression], int]:
    """Points (ok in both) whose median time grew by more than threshold_pct; and how many matched."""
    if threshold_pct < 0:
        raise ValueError(f"--fail-on-regression must be >= 0 percent, got {threshold_pct}")
    old = {r.key(): r for r in baseline if _timed(r)}
    found, matched = [], 0
    for row in current:
        before = old.get(row.key())
        if not _timed(row) or before is None:
            continue
        matched += 1
        change = (row.time_ms / before.time_ms - 1.0) * 100.0
        if change > threshold_pct:
            found.append(Regression(impl=row.impl, seq_len=row.seq_len, mode=row.mode, baseline_ms=before.time_ms,
                                    current_ms=row.time_ms, change_pct=change))
    return found, matched


def _timed(row: BenchRow) -> bool:
    """An ok row with a usable time (a report's rows are checked when read; these may be built in memory)."""
    return row.status == "ok" and row.time_ms is not None and math.isfinite(row.time_ms) and row.time_ms > 0
