"""bench --interleave: the sweep's side with a scripted group runner (which lines are measured together at
each N, failures stop a line, resumed points are not re-run), the worker's side on a tiny real workload
(round-robin samples in one process, a failing line does not take the others down), and the settings it refuses."""

import json

import pytest

from dattn_cli.bench import Sweep
from dattn_cli.bench.interleave import measure_group
from dattn_cli.bench.sweep import run_sweep

SHAPE = dict(heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2], max_memory=2**30, mode="fwd")


def sweep(**settings) -> Sweep:
    return Sweep(
        **{
            "impls": ["ImprovedDilatedAttention", "sdpa"],
            "seq_lens": [256, 512, 1024],
            "interleave": True,
            **SHAPE,
            **settings,
        }
    )


class GroupRunner:
    def __init__(self, fail: dict | None = None):
        self.calls: list[list[tuple[str, int]]] = []
        self.fail = fail or {}  # (impl, N) -> status

    def __call__(self, cfg, problems):
        self.calls.append([(p.impl, p.seq_len) for p in problems])
        results = []
        for p in problems:
            status = self.fail.get((p.impl, p.seq_len))
            results.append(
                {"status": status, "reason": "scripted"}
                if status
                else {"status": "ok", "time_ms": 1.0, "repeats": 1, "interleaved": True}
            )
        return results


def no_single_runs(cfg, problem):
    raise AssertionError("an interleaved sweep runs no point alone")


def test_each_length_measures_every_line_together():
    runner = GroupRunner()
    result = run_sweep(sweep(), runner=no_single_runs, group_runner=runner)
    assert runner.calls == [[("ImprovedDilatedAttention", n), ("sdpa", n)] for n in (256, 512, 1024)]
    assert all(r.status == "ok" and r.interleaved for r in result.rows)
    assert [s.max_ok_seq_len for s in result.summaries] == [1024, 1024]


def test_a_failed_line_is_skipped_at_larger_lengths_and_the_others_go_on():
    runner = GroupRunner(fail={("sdpa", 512): "oom"})
    result = run_sweep(sweep(), runner=no_single_runs, group_runner=runner)
    assert runner.calls[2] == [("ImprovedDilatedAttention", 1024)]
    sdpa = [r for r in result.rows if r.impl == "sdpa"]
    assert [r.status for r in sdpa] == ["ok", "oom", "skipped"] and "after oom at N=512" in sdpa[2].reason
    assert [s.max_ok_seq_len for s in result.summaries] == [1024, 256]


def test_resumed_points_are_not_measured_again(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(seq_lens=[256]), out=out, runner=no_single_runs, group_runner=GroupRunner())
    runner = GroupRunner()
    result = run_sweep(sweep(), out=out, resume=True, runner=no_single_runs, group_runner=runner)
    assert runner.calls == [[("ImprovedDilatedAttention", n), ("sdpa", n)] for n in (512, 1024)]
    assert len(result.rows) == 6
    points = [json.loads(line) for line in out.read_text().splitlines() if '"point"' in line]
    assert len(points) == 6


@pytest.mark.parametrize(
    "settings,needle",
    [
        ({"until_oom": True, "seq_lens": []}, "--until-oom"),
        ({"world_size": 2, "impls": ["RingDilatedAttention"]}, "--world-size"),
    ],
)
def test_settings_interleaving_cannot_serve_are_refused(settings, needle):
    with pytest.raises(ValueError, match=f"--interleave .*{needle}"):
        sweep(**settings)


def test_the_worker_times_the_lines_round_robin_and_keeps_the_others_when_one_fails():
    cfg = sweep(seq_lens=[256], repeat=5, warmup=1)
    good = cfg.point("sdpa", 256)
    bad = good.with_(impl="ImprovedDilatedAttention").model_copy(update={"impl": "no-such-impl"})
    results = measure_group(cfg, [cfg.point("ImprovedDilatedAttention", 256), bad, good])
    assert isinstance(results[1], Exception)
    for fields in (results[0], results[2]):
        assert fields["status"] == "ok" and fields["interleaved"] and len(fields["samples_ms"]) == 5
        assert fields["peak_mem_bytes"] >= 0 and "before this line was built" in fields["mem_method"]
    assert results[0]["peak_mem_bytes"] > 0  # the last line, this small, can fit in memory an earlier line freed
