"""bench.sampling: the warm-up until timings settle, fixed and adaptive repeats, round-robin order, and the
agreement hook distributed ranks stop through. Steps are scripted (times returned, not measured)."""

from itertools import cycle

import pytest

from dattn_cli.bench.sampling import MAX_SAMPLES, MAX_WARMUP_CALLS, MIN_SAMPLES, Clock, take_samples, warm_up


def scripted(*times: float, log: list | None = None, name: str = ""):
    values = cycle(times)

    def step() -> float:
        if log is not None:
            log.append(name)
        return next(values)

    return step


def test_a_fixed_repeat_takes_exactly_that_many_calls():
    (times,), why = take_samples([scripted(1.0, 2.0, 5.0)], 7, 3.0, Clock(1e9))
    assert len(times) == 7 and why == "repeat"


def test_steady_timings_stop_at_the_minimum_with_the_precision_reached():
    (times,), why = take_samples([scripted(1.0, 1.01)], None, 3.0, Clock(1e9))
    assert len(times) == MIN_SAMPLES and why == "precision"


def test_spread_timings_sample_on_until_the_ci_narrows():
    """Half the calls 5% slower: the 95% CI of the median spans both values until enough samples pin it."""
    (times,), why = take_samples([scripted(1.0, 1.0, 1.0, 1.05)], None, 1.0, Clock(1e9))
    assert why == "precision" and len(times) > MIN_SAMPLES


def test_noise_that_never_settles_stops_at_the_sample_limit_or_the_time_budget():
    (times,), why = take_samples([scripted(1.0, 2.0)], None, 3.0, Clock(1e9))
    assert why == "max-samples" and len(times) == MAX_SAMPLES
    (times,), why = take_samples([scripted(1.0, 2.0)], None, 3.0, Clock(0.0))
    assert why == "max-seconds" and len(times) == 1  # the next call would not fit: at least one is taken


def test_interleaved_steps_are_called_round_robin_and_stop_together():
    log: list[str] = []
    steps = [scripted(1.0, log=log, name="A"), scripted(3.0, 3.2, log=log, name="B")]
    (a, b), why = take_samples(steps, None, 3.0, Clock(1e9))
    assert log[:6] == ["A", "B"] * 3 and len(a) == len(b) and why in ("precision", "max-samples")


def test_ranks_stop_when_any_rank_says_so():
    (times,), why = take_samples([scripted(1.0, 2.0)], None, 3.0, Clock(1e9), agree=lambda flag: True)
    assert why == "max-seconds" and len(times) == 1


def test_the_warm_up_runs_until_the_last_three_calls_agree():
    calls, settled = warm_up([scripted(9.0, 5.0, 2.0, 1.0, 1.05, 1.02, 1.0)], None, Clock(1e9))
    assert settled and calls == 1 + 6  # the first call (made before) and 9, 5, 2, 1.0, 1.05, 1.02


def test_a_warm_up_that_never_settles_is_bounded_and_says_so():
    calls, settled = warm_up([scripted(1.0, 2.0)], None, Clock(1e9))
    assert calls == 1 + MAX_WARMUP_CALLS and settled is False
    calls, settled = warm_up([scripted(1.0, 2.0)], None, Clock(0.0))
    assert calls == 1 and settled is False


@pytest.mark.parametrize("warmup,expected", [(0, 1), (1, 1), (4, 4)])
def test_a_fixed_warm_up_counts_the_first_call(warmup, expected):
    log: list[str] = []
    calls, settled = warm_up([scripted(1.0, log=log)], warmup, Clock(1e9))
    assert (calls, settled, len(log)) == (expected, None, max(warmup - 1, 0))
