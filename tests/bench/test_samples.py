"""Raw samples in every row: samples_ms in call order, noise (relative IQR) and the noisy flag with its reason."""

import statistics

import pytest

from dattn_cli.bench import Sweep
from dattn_cli.bench.point import NOISY_IQR, timing_fields
from dattn_cli.bench.worker import make_row, run_isolated
from dattn_cli.workload.records import BenchRow


def test_a_row_keeps_every_timed_call_in_order():
    sweep = Sweep(
        impls=["sdpa"],
        seq_lens=[256],
        heads=2,
        head_dim=16,
        segment_lengths=[64, 128],
        dilation_rates=[1, 2],
        repeat=5,
        warmup=1,
        max_memory=2**30,
        max_seconds=60,
    )
    problem = sweep.point("sdpa", 256)
    result = run_isolated(sweep, problem)
    assert result["status"] == "ok", result
    samples = result["samples_ms"]
    assert len(samples) == result["repeats"] == 5 and all(s > 0 for s in samples)
    assert result["time_ms"] == pytest.approx(statistics.median(samples))
    assert result["noise"] is not None and result["stopped_by"] == "repeat"
    assert result["noisy"] or result["noise"] <= NOISY_IQR  # noisy may have other reasons too (contention)
    assert result["other_cpus"] is None or result["other_cpus"] >= 0
    row = make_row(problem, result, None)  # the fields survive the row model and its JSON
    assert BenchRow.model_validate_json(row.model_dump_json()).samples_ms == samples


SWEEP = Sweep(
    impls=["sdpa"],
    seq_lens=[256],
    heads=2,
    head_dim=16,
    segment_lengths=[64, 128],
    dilation_rates=[1, 2],
    max_memory=2**30,
    max_seconds=60,
)


def fields(times_ms: list[float], stopped_by: str = "precision", probed: dict | None = None) -> dict:
    return timing_fields(SWEEP.point("sdpa", 256), [t / 1e3 for t in times_ms], SWEEP, stopped_by, probed or {})


def test_noise_is_the_relative_iqr_and_flags_spread_samples():
    quiet = fields([10.0, 10.1, 10.2, 9.9, 10.0, 10.1])
    assert quiet["noise"] == pytest.approx(0.01, abs=0.01) and not quiet["noisy"] and quiet["noisy_reason"] is None
    loaded = fields([10.0, 14.0, 30.0, 9.0, 22.0, 11.0])
    assert loaded["noisy"] and "relative IQR" in loaded["noisy_reason"]


def test_too_few_samples_have_no_noise_figure():
    few = fields([1.0, 2.0], stopped_by="repeat")
    assert (few["noise"], few["noisy"], few["noisy_reason"], few["median_ci_pct"]) == (None, False, None, None)


def test_every_reason_to_distrust_a_point_is_named():
    """Spread, precision not reached, other processes' CPU: all in noisy_reason; the probe fields kept."""
    probed = {"other_cpus": 1.4, "contended": True, "contention": "other processes kept 1.4 of 2 CPUs busy"}
    row = fields([10.0, 14.0, 30.0, 9.0, 22.0, 11.0], stopped_by="max-seconds", probed=probed)
    assert row["noisy"] and row["other_cpus"] == 1.4 and row["contended"] and "contention" not in row
    reasons = row["noisy_reason"].split("; ")
    assert len(reasons) == 3 and "relative IQR" in reasons[0] and "1.4 of 2 CPUs" in reasons[1]
    assert "stopped by max-seconds after 6 samples" in reasons[2] and "--precision 3%" in reasons[2]


def test_the_ci_of_the_median_is_recorded():
    row = fields([10.0] * 5 + [10.5] * 5)
    assert row["median_ci_pct"] == pytest.approx(100 * 0.25 / 10.25) and row["stopped_by"] == "precision"
