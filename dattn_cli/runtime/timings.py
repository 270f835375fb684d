"""Statistics of one list of timed calls, shared by bench (when to stop sampling, the noise flag) and compare
(its sides): the relative IQR, the distribution-free 95% CI of the median, and the warm-up's settle rule.
numpy only (no scipy): bench's workers import this, and scipy.stats costs them a second at start-up."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

CONFIDENCE = 0.95
SETTLE_WINDOW = 3  # the warm-up has settled when its last 3 calls ...
SETTLE_SPREAD = 0.10  # ... are within 10% of the fastest of them


def checked(samples: Sequence[float], name: str = "samples") -> np.ndarray:
    """`samples` as a float array; a ValueError naming `name` unless they are positive finite numbers."""
    try:
        values = np.asarray(samples, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of numbers (milliseconds)") from None
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{name} must be a non-empty list of numbers")
    bad = values[~(np.isfinite(values) & (values > 0))]
    if bad.size:
        raise ValueError(f"{name} must hold positive, finite times, got {float(bad[0])!r}")
    return values


def relative_iqr(samples: Sequence[float]) -> float:
    """(q75 - q25) / median (numpy's linear quantiles): the noise of one list of times, scale free."""
    q25, q50, q75 = np.percentile(checked(samples), [25, 50, 75])
    return float((q75 - q25) / q50)


@lru_cache(maxsize=1024)
def median_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """j, the largest with P(Binomial(n, 1/2) <= j - 1) <= (1 - confidence) / 2, capped at (n + 1) // 2: the
    order statistics j and n + 1 - j bound the median with at least that confidence. Exact integers."""
    tail, total, below, j = (1.0 - confidence) / 2, 2**n, 0, 0
    for k in range((n + 1) // 2):
        below += math.comb(n, k)  # P(B <= k) * 2^n
        if below / total > tail:
            break
        j = k + 1
    return j


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free CI of the median: order statistics j and n+1-j (median_rank). None when n is too
    small for that confidence (n < 6 at 95%)."""
    values = np.sort(checked(samples))
    j = median_rank(values.size, confidence)
    return None if j == 0 else (float(values[j - 1]), float(values[values.size - j]))


def median_ci_pct(samples: Sequence[float]) -> float | None:
    """The 95% CI of the median as a percentage of it: the farther of its two edges. None below 6 samples."""
    if (ci := median_ci(samples)) is None:
        return None
    median = float(np.median(samples))
    return 100.0 * max(median - ci[0], ci[1] - median) / median


def settled(times: Sequence[float]) -> bool:
    """Have the warm-up's timings settled: its last SETTLE_WINDOW calls within SETTLE_SPREAD of their fastest?"""
    if len(times) < SETTLE_WINDOW:
        return False
    last = times[-SETTLE_WINDOW:]
    return max(last) <= min(last) * (1 + SETTLE_SPREAD)
