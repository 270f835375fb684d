"""A point measured in several worker processes (bench/processes.py): samples pooled, and the row's stopped_by
and noisy reason judged on the pooled samples, not carried over from the processes."""

import random

import pytest

from dattn_cli.bench import Sweep
from dattn_cli.bench.point import timing_fields
from dattn_cli.bench.processes import pooled, run_in_processes
from dattn_cli.runtime.timings import median_ci_pct

SWEEP = Sweep(
    impls=["sdpa"],
    seq_lens=[256],
    heads=2,
    head_dim=16,
    segment_lengths=[64, 128],
    dilation_rates=[1, 2],
    max_memory=2**30,
    max_seconds=60,
    precision=5,
)
PROBLEM = SWEEP.point("sdpa", 256)


def process(median_ms: float, stopped_by: str = "precision", n: int = 30, seed: int = 0) -> dict:
    """One process's ok result: n samples within +-0.5% of median_ms."""
    rng = random.Random(seed)
    times = [median_ms * (1 + rng.uniform(-0.005, 0.005)) / 1e3 for _ in range(n)]
    result = timing_fields(PROBLEM, times, SWEEP, stopped_by, {})
    result.update(peak_mem_bytes=1000, warmup_calls=3, warmup_settled=True)
    return result


def test_processes_that_each_met_the_precision_but_not_together_say_what_the_pool_reached():
    results = [process(m, seed=i) for i, m in enumerate((10.0, 12.0))]  # the pool's median falls between them
    assert all(r["stopped_by"] == "precision" and r["median_ci_pct"] < 1 for r in results)
    row = pooled(results, PROBLEM, SWEEP)
    pooled_times = [t / 1e3 for r in results for t in r["samples_ms"]]
    assert row["median_ci_pct"] == pytest.approx(median_ci_pct(pooled_times)) and row["median_ci_pct"] > 5
    assert row["stopped_by"] == "processes" and row["noisy"]
    assert (
        f"the 60 pooled samples give the median to +-{row['median_ci_pct']:.1f}%, not --precision 5%"
        in (row["noisy_reason"])
    )


def test_processes_that_agree_keep_precision():
    row = pooled([process(10.0, seed=i) for i in range(3)], PROBLEM, SWEEP)
    assert row["stopped_by"] == "precision" and row["median_ci_pct"] <= 5
    assert row["noisy_reason"] is None or "stopped by" not in row["noisy_reason"]


def test_a_process_stopped_by_the_time_budget_is_named_with_the_pooled_ci():
    results = [process(10.0, seed=0), process(13.0, "max-seconds", n=12, seed=1), process(11.0, seed=2)]
    row = pooled(results, PROBLEM, SWEEP)
    assert row["stopped_by"] == "max-seconds"
    assert "stopped by max-seconds in 1 of 3 processes, and the 72 pooled samples" in row["noisy_reason"]
    assert "not --precision 5%" in row["noisy_reason"] and row["noisy_reason"].count("stopped by") == 1


def test_a_time_budget_stop_whose_pool_meets_the_precision_is_precision():
    results = [process(10.0, seed=0), process(10.0, "max-seconds", n=12, seed=1)]
    row = pooled(results, PROBLEM, SWEEP)
    assert row["stopped_by"] == "precision" and row["noisy_reason"] is None


def test_fixed_repeats_stay_repeat():
    sweep = SWEEP.model_copy(update={"repeat": 30})
    row = pooled([process(m, "repeat", seed=i) for i, m in enumerate((10.0, 12.0))], PROBLEM, sweep)
    assert row["stopped_by"] == "repeat" and row["processes"] == 2 and row["process_medians_ms"][0] < 10.1


def test_run_in_processes_shares_the_budget_and_stops_at_the_first_failure():
    budgets, answers = [], iter([process(10.0), {"status": "oom", "reason": "out of memory"}, process(10.0)])

    def launch(sweep, problem):
        budgets.append(sweep.max_seconds)
        return next(answers)

    sweep = SWEEP.model_copy(update={"processes": 3})
    assert run_in_processes(sweep, PROBLEM, launch)["status"] == "oom"
    assert budgets == [20.0, 20.0]
