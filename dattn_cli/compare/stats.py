"""Sample statistics of timings and the verdict on two sets of them.

A side is the list of timed calls of one point (`samples_ms`). Timings on a shared machine are skewed and
heavy-tailed (a preempted call takes 2-50x longer), so everything here is rank based: medians, the
relative interquartile range as the noise figure, order statistics for the CI of a median, and the
Mann-Whitney U test with the Hodges-Lehmann estimate for two sides.

The ratio NEW/BASE and its 95% CI: Hodges-Lehmann on log samples, with Moses' distribution-free interval.
A change of speed multiplies every call by the same factor r, i.e. shifts log(time) by log(r); the HL
estimate of that shift is the median of all pairwise differences log(new_j) - log(base_i), and the CI is
the range of those differences between the order statistics k and nm + 1 - k, k from the exact null
distribution of U (normal approximation beyond 60 samples in all). Chosen over a bootstrap because it is
exact under that model for any sample size (a percentile bootstrap of a median undercovers at 10-15
samples, where its resamples take only a few distinct values), needs no random seed and no thousands of
resamples, and is the interval of the very test whose p-value is reported: the 95% CI excludes 1 when the
exact two-sided p is below 0.05.

The verdict (`verdict`) at threshold t% (the smallest change that counts), band = [1/(1+t), 1+t]:

* slower: p < alpha and the whole 95% CI of the ratio lies above 1+t (a change beyond the threshold is
  established, not only a change);
* faster: p < alpha and the whole CI lies below 1/(1+t) (the band is symmetric on a log scale);
* same: the whole CI lies inside the band (any change is established to be smaller than the threshold);
  with t = 0, whose band is the single point 1 that no CI fits in, whenever no change is established
  (neither slower nor faster);
* inconclusive: anything else (the CI straddles an edge of the band: noise too high for this threshold;
  more samples narrow it), or no CI (fewer than 4 samples a side cannot give 95%).

Why it holds its false-alarm target: a false alarm needs the CI's far edge past 1+t while the truth is 1;
with t > 0 that is far rarer than the CI's own 2.5% miss rate. Callers comparing many points pass
Holm-adjusted p-values (`holm`), so that with t = 0 the run as a whole keeps alpha. Independent samples
are assumed; noise that moves one whole side (load during one run only) cannot be told from a real change
by any test on the samples, which is why the environment records are compared too (match.py) and a side
that is much noisier than the other makes a slower/faster verdict inconclusive (`spread_differs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel

from ..runtime.timings import CONFIDENCE, checked, median_ci, relative_iqr

Verdict = Literal["faster", "slower", "same", "inconclusive"]

EXACT_LIMIT = 60  # n + m up to which U's null distribution is counted exactly (C(60, 30) fits in int64)
PAIR_LIMIT = 4_000_000  # pairwise differences kept in memory; larger sides are thinned evenly
SPREAD_ALPHA = 0.01  # level of the test that one side is more spread out than the other
SPREAD_FACTOR = 2.0  # ... and by how much its relative IQR must exceed the other's


class SampleStats(BaseModel):
    """One side's figures: size, median, relative IQR and the 95% CI of the median (None below 6 samples)."""

    n: int
    median: float
    noise: float
    ci_low: float | None = None
    ci_high: float | None = None


def summarize(samples: Sequence[float]) -> SampleStats:
    values = checked(samples)
    ci = median_ci(values)
    return SampleStats(
        n=values.size,
        median=float(np.median(values)),
        noise=relative_iqr(values),
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
    )


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> np.ndarray:
    """How many of the C(n+m, n) orderings give U = 0..nm: the coefficients of the Gaussian binomial
    [n+m choose n]_q, built as prod_i (1 - q^(m+i)) / (1 - q^i) in exact integers."""
    counts = np.zeros(n * m + 1, dtype=np.int64)
    counts[0] = 1
    for i in range(1, n + 1):
        counts[m + i :] -= counts[: n * m + 1 - (m + i)].copy()
        for r in range(i):  # divide by (1 - q^i): a running sum along each residue class mod i
            counts[r::i] = np.cumsum(counts[r::i])
    return counts


def _rank_bound(n: int, m: int, confidence: float) -> int:
    """k, the largest with P(U < k) <= (1 - confidence)/2 under no difference; 0 when no k qualifies."""
    tail = (1.0 - confidence) / 2
    if n + m <= EXACT_LIMIT:
        cumulative = np.cumsum(_u_counts(n, m)) / math.comb(n + m, n)
        return int(np.searchsorted(cumulative, tail, side="right"))
    from scipy.stats import norm

    sd = math.sqrt(n * m * (n + m + 1) / 12.0)
    return max(0, int(math.floor(n * m / 2.0 + 0.5 - norm.ppf(1.0 - tail) * sd)))


def _thin(values: np.ndarray, keep: int) -> np.ndarray:
    """Evenly spaced order statistics: the same distribution, fewer values (only for huge sides)."""
    if values.size <= keep:
        return values
    return np.sort(values)[np.linspace(0, values.size - 1, keep).round().astype(int)]


def _log_differences(base: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, int, int]:
    """All pairwise log(new_j) - log(base_i) (unsorted), and the side sizes they come from (thinned when the
    pairs would pass PAIR_LIMIT)."""
    if base.size * new.size > PAIR_LIMIT:
        root = math.isqrt(PAIR_LIMIT)
        base, new = _thin(base, max(root, PAIR_LIMIT // new.size)), _thin(new, max(root, PAIR_LIMIT // base.size))
    return np.subtract.outer(np.log(new), np.log(base)).ravel(), base.size, new.size


def ratio_estimate(base: Sequence[float], new: Sequence[float]) -> float:
    """Hodges-Lehmann estimate of NEW/BASE: exp of the median of all pairwise log differences."""
    d, _, _ = _log_differences(checked(base, "base"), checked(new, "new"))
    return float(math.exp(np.median(d)))


def ratio_ci(base: Sequence[float], new: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Moses' CI of the ratio NEW/BASE (module docstring); None when the sides are too small for
    `confidence` (at 95%: 3 and 3 samples cannot give it, 4 and 4 can)."""
    d, n_base, n_new = _log_differences(checked(base, "base"), checked(new, "new"))
    k = _rank_bound(n_base, n_new, confidence)
    if k < 1:
        return None
    d = np.partition(d, [k - 1, d.size - k])
    return float(math.exp(d[k - 1])), float(math.exp(d[d.size - k]))


def mann_whitney_p(base: Sequence[float], new: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (scipy): exact up to EXACT_LIMIT samples without ties (as the CI),
    else the normal approximation with tie correction."""
    from scipy.stats import mannwhitneyu

    b, a = checked(base, "base"), checked(new, "new")
    both = np.concatenate([a, b])
    if np.all(both == both[0]):
        return 1.0  # scipy's asymptotic form divides by a zero variance here
    ties = np.unique(both).size < both.size
    method = "exact" if both.size <= EXACT_LIMIT and not ties else "asymptotic"
    return float(mannwhitneyu(a, b, alternative="two-sided", method=method).pvalue)


def spread_differs(base: Sequence[float], new: Sequence[float]) -> str | None:
    """Why one side looks like it was measured under other conditions: its log samples are more spread out
    (Fligner-Killeen test, p < SPREAD_ALPHA) and its relative IQR is over SPREAD_FACTOR times the other's.
    A change of code shifts log times and keeps their spread; intermittent load on one side widens it."""
    b, a = checked(base, "base"), checked(new, "new")
    if min(a.size, b.size) < 5:
        return None
    noise_b, noise_a = relative_iqr(b), relative_iqr(a)
    wider, narrower, name = (noise_a, noise_b, "new") if noise_a >= noise_b else (noise_b, noise_a, "base")
    if wider <= SPREAD_FACTOR * max(narrower, 1e-12):
        return None
    from scipy.stats import fligner

    if not (fligner(np.log(a), np.log(b)).pvalue < SPREAD_ALPHA):
        return None
    return f"{name} samples are far noisier (relative IQR {wider:.0%} vs {narrower:.0%}): load on one side only?"


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (None stays None): compare each with alpha to keep the family-wise
    false-alarm rate of many points at alpha."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = list(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (len(present) - rank) * p))
        adjusted[i] = running
    return adjusted


def band(threshold_pct: float) -> tuple[float, float]:
    """The ratios that count as no change at threshold t%: [1/(1+t), 1+t]."""
    if not (math.isfinite(threshold_pct) and threshold_pct >= 0):
        raise ValueError(f"--threshold must be a finite percentage >= 0, got {threshold_pct}")
    upper = 1.0 + threshold_pct / 100.0
    return 1.0 / upper, upper


def verdict(
    ci_low: float | None, ci_high: float | None, p_value: float | None, threshold_pct: float, alpha: float = 0.05
) -> Verdict:
    """faster | slower | same | inconclusive from the 95% CI of the ratio NEW/BASE and the (adjusted)
    p-value, by the rule in the module docstring."""
    lower, upper = band(threshold_pct)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if ci_low is None or ci_high is None:
        return "inconclusive"
    significant = p_value is not None and p_value < alpha
    if significant and ci_low > upper:
        return "slower"
    if significant and ci_high < lower:
        return "faster"
    if (lower <= ci_low and ci_high <= upper) or threshold_pct == 0:
        return "same"
    return "inconclusive"
