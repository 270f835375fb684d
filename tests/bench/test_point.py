"""bench/point.py: the first call kept apart from the budget and the samples."""

from types import SimpleNamespace

from dattn_cli.bench.point import first_call


def sweep(max_seconds: float, repeat: int = 3):
    return SimpleNamespace(max_seconds=max_seconds, cuda=True, warmup=1, repeat=repeat)


def steps(*seconds: float):
    """A step that reports these call times in turn (a compile first, say), counting its calls."""
    calls = []

    def step() -> float:
        calls.append(None)
        return seconds[min(len(calls), len(seconds)) - 1]

    return step, calls


def test_a_slow_first_call_does_not_skip_a_point_that_fits():
    step, calls = steps(5.5, 0.05)  # FA4's compile in the first call, then 50 ms calls
    first_s, clock, skipped = first_call(sweep(max_seconds=20, repeat=5), step)  # 5 x 5.5 s would not fit
    assert skipped is None and first_s == 5.5 and len(calls) == 2
    assert clock.spent() < 1.0  # the budget starts after the first call


def test_a_point_too_slow_without_its_first_call_is_skipped_with_that_call_recorded():
    step, calls = steps(8.0, 7.0)
    _, _, skipped = first_call(sweep(max_seconds=20), step)
    assert skipped["status"] == "skipped" and "one call took 7.00 s" in skipped["reason"]
    assert skipped["first_call_ms"] == 8000.0 and len(calls) == 2


def test_a_first_call_over_the_whole_budget_is_not_repeated():
    step, calls = steps(30.0, 0.01)
    _, _, skipped = first_call(sweep(max_seconds=20), step)
    assert skipped["status"] == "skipped" and len(calls) == 1


def test_a_fast_first_call_is_the_only_projection_call():
    step, calls = steps(0.01)
    assert first_call(sweep(max_seconds=20), step)[2] is None and len(calls) == 1
