"""How many calls a point takes: the warm-up until its timings settle, then timed calls until the median is
known to --precision (or a fixed --warmup / --repeat count).

Adaptive sampling, after NVBench's stopping criterion: keep taking timed calls until the 95% CI of the
median (order statistics, distribution free: runtime.timings.median_ci) lies within +-PCT of the median, with
at least MIN_SAMPLES calls, and stop early when the point's --max-seconds would be overrun or MAX_SAMPLES
are taken; the row records why it stopped. The warm-up runs until the last 3 calls are within 10% of each
other (runtime.timings.settled), within a quarter of the time budget and MAX_WARMUP_CALLS.

Several steps (--interleave) are called round-robin, one call each per round, and stop together: every
line then has as many samples, taken under the same conditions. Distributed ranks must take the same
branches: their times are already the slowest rank's (identical on every rank), and each stop decision
that reads a clock goes through `agree` (an all-reduce).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..runtime.timings import median_ci_pct, settled

MIN_SAMPLES = 10  # adaptive: the fewest timed calls (NVBench's default; also what compare's rank test wants)
MAX_SAMPLES = 1000
MAX_WARMUP_CALLS = 25
WARMUP_SHARE = 0.25  # of the time budget the warm-up may take

Step = Callable[[], float]
Agree = Callable[[bool], bool]  # True on every rank when True on any


def alone(flag: bool) -> bool:
    return flag


@dataclass
class Clock:
    """The time budget of a point (of all interleaved lines together), from the call after its first."""

    seconds: float
    began: float = field(default_factory=time.perf_counter)

    def spent(self) -> float:
        return time.perf_counter() - self.began

    def fits(self, next_seconds: float, share: float = 1.0) -> bool:
        """Would a call taking next_seconds end within `share` of the budget?"""
        return self.spent() + next_seconds <= share * self.seconds


def _round(steps: Sequence[Step], into: list[list[float]]) -> float:
    """One call of each step; the seconds of the round."""
    total = 0.0
    for step, times in zip(steps, into):
        times.append(step())
        total += times[-1]
    return total


def warm_up(steps: Sequence[Step], warmup: int | None, clock: Clock, agree: Agree = alone) -> tuple[int, bool | None]:
    """Warm-up calls of every step after its first; (calls per step, whether the timings settled)."""
    if warmup is not None:  # a fixed count; the first call (made before, for the time projection) is one of them
        for _ in range(warmup - 1):
            _round(steps, [[] for _ in steps])
        return max(warmup, 1), None
    history: list[list[float]] = [[] for _ in steps]
    last = 0.0
    while True:
        done = all(settled(times) for times in history)
        stop = done or len(history[0]) >= MAX_WARMUP_CALLS or not clock.fits(last, WARMUP_SHARE)
        if agree(stop):
            return 1 + len(history[0]), done
        last = _round(steps, history)


def take_samples(
    steps: Sequence[Step], repeat: int | None, precision_pct: float, clock: Clock, agree: Agree = alone
) -> tuple[list[list[float]], str]:
    """The timed calls of every step, round-robin: `repeat` of them, or adaptively (module docstring)."""
    samples: list[list[float]] = [[] for _ in steps]
    while True:
        last = _round(steps, samples)
        n = len(samples[0])
        if repeat is not None:
            if n >= repeat:
                return samples, "repeat"
            continue
        if n >= MIN_SAMPLES and all(_precise(times, precision_pct) for times in samples):
            return samples, "precision"
        if n >= MAX_SAMPLES:
            return samples, "max-samples"
        if agree(not clock.fits(last)):
            return samples, "max-seconds"


def _precise(times: list[float], precision_pct: float) -> bool:
    return (pct := median_ci_pct(times)) is not None and pct <= precision_pct
