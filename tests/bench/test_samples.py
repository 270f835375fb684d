"""Raw samples in every row: samples_ms in call order, noise (relative IQR) and the noisy flag with its reason."""

import statistics

import pytest

from dattn_cli.bench import Sweep
from dattn_cli.bench.point import NOISY_IQR, noise_fields
from dattn_cli.bench.worker import make_row, run_isolated
from dattn_cli.workload.records import BenchRow


def test_a_row_keeps_every_timed_call_in_order():
    sweep = Sweep(impls=["sdpa"], seq_lens=[256], heads=2, head_dim=16, segment_lengths=[64, 128],
                  dilation_rates=[1, 2], repeat=5, warmup=1, max_memory=2**30, max_seconds=60)
    problem = sweep.point("sdpa", 256)
    result = run_isolated(sweep, problem)
    assert result["status"] == "ok", result
    samples = result["samples_ms"]
    assert len(samples) == result["repeats"] == 5 and all(s > 0 for s in samples)
    assert result["time_ms"] == pytest.approx(statistics.median(samples))
    assert result["noise"] is not None and result["noisy"] == (result["noise"] > NOISY_IQR)
    row = make_row(problem, result, None)  # the fields survive the row model and its JSON
    assert BenchRow.model_validate_json(row.model_dump_json()).samples_ms == samples


def test_noise_is_the_relative_iqr_and_flags_spread_samples():
    quiet = noise_fields(sorted([10.0, 10.1, 10.2, 9.9, 10.0, 10.1]))
    assert quiet["noise"] == pytest.approx(0.01, abs=0.01) and not quiet["noisy"] and quiet["noisy_reason"] is None
    loaded = noise_fields(sorted([10.0, 14.0, 30.0, 9.0, 22.0, 11.0]))
    assert loaded["noisy"] and "relative IQR" in loaded["noisy_reason"]


def test_too_few_samples_have_no_noise_figure():
    assert noise_fields([1.0, 2.0]) == {"noise": None, "noisy": False, "noisy_reason": None}
