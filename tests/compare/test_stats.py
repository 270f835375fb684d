"""dattn_cli.compare.stats on synthetic timings: heavy-tailed samples like a loaded machine's (lognormal
body, 10% of calls preempted 2-50x), fixed seeds, no timing of anything."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dattn_cli.compare.stats import (
    holm,
    mann_whitney_p,
    median_ci,
    ratio_ci,
    ratio_estimate,
    relative_iqr,
    spread_differs,
    summarize,
    verdict,
)

PAIRS = 200
THRESHOLD = 10.0


def loaded(rng: np.random.Generator, n: int, scale: float = 1.0, sigma: float = 0.05) -> np.ndarray:
    """n call times in ms: lognormal around 10 ms, 10% of them 2-50x slower (preempted)."""
    times = rng.lognormal(math.log(10.0), sigma, n)
    hit = rng.random(n) < 0.10
    times[hit] *= rng.uniform(2.0, 50.0, hit.sum())
    return times * scale


def judge(base: np.ndarray, new: np.ndarray, threshold: float = THRESHOLD) -> str:
    ci = ratio_ci(base, new) or (None, None)
    result = verdict(*ci, mann_whitney_p(base, new), threshold)
    if result in ("slower", "faster") and spread_differs(base, new):
        return "inconclusive"
    return result


def test_aa_pairs_rarely_raise_a_false_alarm():
    rng = np.random.default_rng(1)
    verdicts = [judge(loaded(rng, 15), loaded(rng, 15)) for _ in range(PAIRS)]
    alarms = sum(v in ("slower", "faster") for v in verdicts)
    assert alarms / PAIRS <= 0.05, verdicts
    assert verdicts.count("same") / PAIRS >= 0.6  # at 5% noise and 15 samples most A/A pairs are settled


def test_aa_pairs_at_threshold_zero_keep_alpha():
    rng = np.random.default_rng(2)
    alarms = sum(judge(loaded(rng, 12), loaded(rng, 12), 0.0) in ("slower", "faster") for _ in range(PAIRS))
    assert alarms / PAIRS <= 0.08  # the test's own 5%, with room for 200 draws


def test_a_25_percent_slowdown_is_detected_with_15_samples():
    rng = np.random.default_rng(3)
    verdicts = [judge(loaded(rng, 15), loaded(rng, 15, 1.25)) for _ in range(PAIRS)]
    assert verdicts.count("slower") / PAIRS >= 0.95
    assert "faster" not in verdicts


def test_a_25_percent_speedup_is_detected():
    rng = np.random.default_rng(4)
    verdicts = [judge(loaded(rng, 15), loaded(rng, 15, 0.8)) for _ in range(PAIRS)]
    assert verdicts.count("faster") / PAIRS >= 0.95


def test_ratio_ci_covers_the_true_ratio():
    rng = np.random.default_rng(5)
    for true in (1.0, 1.25, 0.7):
        cover = 0
        for _ in range(PAIRS):
            low, high = ratio_ci(loaded(rng, 12), loaded(rng, 12, true))
            cover += low <= true <= high
        assert cover / PAIRS >= 0.92, (true, cover)


def test_ratio_estimate_and_ci_on_exact_shift():
    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    new = [v * 1.5 for v in base]
    assert ratio_estimate(base, new) == pytest.approx(1.5)
    low, high = ratio_ci(base, new)
    assert low < 1.5 < high
    assert ratio_ci([1, 2, 3], [1, 2, 3]) is None  # 3 and 3 samples cannot give 95%
    assert ratio_ci([1, 2, 3, 4], [1, 2, 3, 4]) is not None


def test_ratio_ci_of_large_sides():
    rng = np.random.default_rng(6)
    low, high = ratio_ci(loaded(rng, 3000), loaded(rng, 3000, 1.1))  # thinned, normal approximation
    assert 1.0 < low < 1.1 < high < 1.2


def test_median_ci_order_statistics():
    assert median_ci(range(1, 6)) is None  # 5 samples: even min-max covers only 94%
    assert median_ci(range(1, 7)) == (1.0, 6.0)
    assert median_ci(range(1, 11)) == (2.0, 9.0)  # the textbook 95% interval for n = 10
    assert median_ci(range(1, 16)) == (4.0, 12.0)


def test_summary_and_noise():
    stats = summarize([10.0, 10.0, 11.0, 12.0, 100.0])
    assert stats.median == 11.0 and stats.n == 5 and stats.ci_low is None
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)


def test_mann_whitney_p():
    assert mann_whitney_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert mann_whitney_p([1.0] * 5, [1.0] * 5) == 1.0
    assert mann_whitney_p(range(1, 11), range(11, 21)) < 1e-4


@pytest.mark.parametrize("samples", [[], [1.0, -2.0], [1.0, float("nan")], [0.0, 1.0], [1.0, float("inf")]])
def test_bad_samples_are_refused(samples):
    with pytest.raises(ValueError, match="positive, finite|non-empty"):
        summarize(samples)


def test_verdict_rule():
    assert verdict(1.12, 1.30, 0.001, 10) == "slower"
    assert verdict(1.05, 1.30, 0.001, 10) == "inconclusive"  # beyond 1 but not established beyond 10%
    assert verdict(1.12, 1.30, 0.2, 10) == "inconclusive"  # the (adjusted) test does not agree
    assert verdict(0.70, 0.85, 0.001, 10) == "faster"
    assert verdict(0.95, 1.04, 0.5, 10) == "same"
    assert verdict(1.01, 1.04, 0.01, 10) == "same"  # a real change, smaller than the threshold
    assert verdict(0.95, 1.04, 0.5, 0) == "same"
    assert verdict(1.01, 1.04, 0.01, 0) == "slower"
    assert verdict(1.01, 1.04, 0.2, 0) == "same"  # at threshold 0: no change established (p adjusted)
    assert verdict(None, None, None, 10) == "inconclusive"
    with pytest.raises(ValueError, match="--threshold"):
        verdict(1.0, 1.0, 0.5, -1)
    with pytest.raises(ValueError, match="--threshold"):
        verdict(1.0, 1.0, 0.5, float("nan"))


def test_holm():
    assert holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
    assert holm([]) == []


def test_one_sided_load_makes_a_slowdown_inconclusive():
    rng = np.random.default_rng(7)
    base = rng.lognormal(math.log(10.0), 0.02, 20)
    new = rng.lognormal(math.log(10.0), 0.02, 20) * rng.choice([1.0, 1.6, 2.5], 20)  # load comes and goes
    assert spread_differs(base, new) is not None and "new" in spread_differs(base, new)
    assert spread_differs(base, base * 1.3) is None  # a code change shifts, it does not widen
