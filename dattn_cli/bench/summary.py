"""What a sweep found per measured line: the longest length that ran, what stopped it (machine-readable and
in words), the fitted scaling exponents; and the time ratio of every row against the sweep's dense baseline.

What stops a line is named by the row that stopped it, never guessed: an OOM or a measured peak above
--max-memory is "memory"; a point skipped because its repeats would overrun --max-seconds is "time"; a
point skipped unrun because the planner's prediction is far above --max-memory is "prediction"; a crash
is "error"; any other skip (e.g. a length the ranks cannot shard) is "skipped"."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, computed_field

from ..workload.records import BenchRow
from .plot import fit_exponent

StopReason = Literal["memory", "time", "prediction", "error", "skipped", "doublings"]
PREDICTED = "memory: predicted"  # how a prediction skip's reason begins (sweep._Sweeper._result)


class ImplSummary(BaseModel):
    impl: str
    pattern: str | None = None  # block-sparse lines: the pattern (one line per target density)
    max_ok_seq_len: int | None
    stopped_by: StopReason | None = None  # None: every length ran ok
    stopped_at: int | None = None  # the length that stopped the line
    limit: str | None = None  # what stopped it, in words, e.g. "stopped by memory (oom) at N=16,384"
    time_exponent: float | None = None  # time ~ N^a over the line's ok points; None with fewer than two lengths
    memory_exponent: float | None = None  # peak memory ~ N^b, likewise

    @computed_field
    @property
    def summary(self) -> str:
        """The line's result in one sentence: 'max N 65,536; stopped by --max-seconds at N=131,072, not by memory'."""
        best = f"max N {self.max_ok_seq_len:,}" if self.max_ok_seq_len else "no length ran ok"
        return f"{best}; {self.limit or 'all ok'}"


def stop_reason(row: BenchRow) -> StopReason:
    """Which kind of limit a failed row is."""
    if row.status in ("oom", "error"):
        return "memory" if row.status == "oom" else "error"
    reason = row.reason or ""
    if reason.startswith("time"):
        return "time"
    if reason.startswith(PREDICTED):
        return "prediction"
    return "skipped"


def describe_stop(row: BenchRow) -> str:
    """The failed row as the sentence that says what stopped the line there."""
    at = f"N={row.seq_len:,}"
    by = stop_reason(row)
    if by == "memory":
        detail = f": {row.reason}" if row.reason and row.reason != "out of memory" else ""
        return f"stopped by memory (oom) at {at}{detail}"
    if by == "time":
        return f"stopped by --max-seconds at {at}, not by memory"
    if by == "prediction":
        return f"stopped by the predicted memory at {at} ({row.reason.removeprefix('memory: ')}), not measured"
    if by == "error":
        return f"stopped by an error at {at}: {row.error or row.reason}"
    return f"stopped at {at}: {row.reason}"


def summarize(impl: str, best: int | None, row: BenchRow | None, extra: str = "") -> ImplSummary:
    """A line's summary; `row` is the one that stopped it (None: every length ran ok)."""
    if row is None:
        return ImplSummary(impl=impl, max_ok_seq_len=best)
    stop = {"stopped_by": stop_reason(row), "stopped_at": row.seq_len, "limit": describe_stop(row) + extra}
    return ImplSummary(impl=impl, max_ok_seq_len=best, **stop)


def scaling_exponents(rows: list[BenchRow]) -> dict[str, float | None]:
    """Fitted time and memory exponents (y ~ N^slope) over the ok rows of one line."""
    ok = sorted((r for r in rows if r.status == "ok"), key=lambda r: r.seq_len)
    lengths = [r.seq_len for r in ok]
    return {
        "time_exponent": fit_exponent(lengths, [r.time_ms for r in ok]),
        "memory_exponent": fit_exponent(lengths, [r.peak_mem_bytes for r in ok]),
    }


def dense_baseline(rows: list[BenchRow]) -> str | None:
    """The first dense baseline (sdpa, math, flash) among the rows, in sweep order; None without one."""
    from ..kernels.registry import REGISTRY

    for row in rows:
        spec = REGISTRY.get(row.impl)
        if spec is not None and spec.baseline and spec.strategy == "dense":
            return row.impl
    return None


def time_ratios(rows: list[BenchRow]) -> tuple[str | None, list[float | None]]:
    """The dense baseline and each row's time over the baseline's time at the same N (None where either is missing)."""
    base = dense_baseline(rows)
    times = {r.seq_len: r.time_ms for r in rows if r.impl == base and r.status == "ok" and r.time_ms}
    return base, [
        r.time_ms / times[r.seq_len] if r.status == "ok" and r.time_ms and r.seq_len in times else None for r in rows
    ]
