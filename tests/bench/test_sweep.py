"""Sweeps with a scripted runner (deterministic, fast): incremental rows, resume, until-oom, skips."""

import json

import pytest

from dattn_cli.bench import Sweep, read_rows, run_sweep
from dattn_cli.plan import predicted_peak_bytes
from dattn_cli.workload.records import BenchRow, row_fields

BASE = dict(heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2], max_memory=2**30)


def ok_result(n):
    return {
        "status": "ok",
        "time_ms": n / 100,
        "time_ms_p10": n / 110,
        "time_ms_p90": n / 90,
        "repeats": 3,
        "tokens_per_s": 1e5,
        "flops": 1.0,
        "tflops": 1e-6,
        "peak_mem_bytes": 1000 * n,
    }


class Runner:
    """Scripted worker: ok up to `limit`, oom above; records calls; checks rows are already on disk."""

    def __init__(self, limit=10**9, out=None):
        self.limit, self.out, self.calls = limit, out, []

    def __call__(self, sweep, problem):
        impl, n = problem.impl, problem.seq_len
        if self.out is not None:  # every earlier point is durable before the next one starts
            assert len(read_rows(self.out)) == len(self.calls)
        self.calls.append((impl, n))
        return ok_result(n) if n <= self.limit else {"status": "oom", "reason": "out of memory", "error": "simulated"}


def test_fixed_sweep_appends_rows_as_it_goes(tmp_path):
    out = tmp_path / "r.jsonl"
    cfg = Sweep(impls=["ImprovedDilatedAttention", "sdpa"], seq_lens=[256, 512, 1024], **BASE)
    runner = Runner(out=out)
    result = run_sweep(cfg, out=out, runner=runner)
    assert len(runner.calls) == 6 and len(result.rows) == 6
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["record"] == "environment"
    for key in (
        "dattn_version",
        "git_commit",
        "torch_version",
        "cuda_version",
        "nvidia_driver",
        "cpu",
        "seed",
        "command",
    ):
        assert key in lines[0]
    spec_fields = {
        "impl",
        "semantics",
        "dtype",
        "device",
        "batch",
        "heads",
        "head_dim",
        "seq_len",
        "segments",
        "dilations",
        "causal",
        "mode",
        "world_size",
        "status",
        "time_ms",
        "time_ms_p10",
        "time_ms_p90",
        "tokens_per_s",
        "tflops",
        "peak_mem_bytes",
        "predicted_mem_bytes",
        "error",
    }
    assert all(spec_fields <= line.keys() for line in lines[1:] if line["record"] == "point")
    assert lines[-1]["record"] == "run_end"
    assert [s.max_ok_seq_len for s in result.summaries] == [1024, 1024]


def test_after_a_failure_longer_lengths_are_skipped_and_next_impl_runs(tmp_path):
    cfg = Sweep(impls=["ImprovedDilatedAttention", "sdpa"], seq_lens=[256, 512, 1024], **BASE)
    runner = Runner(limit=300)
    result = run_sweep(cfg, runner=runner)
    statuses = [(r.impl, r.seq_len, r.status) for r in result.rows]
    assert statuses[:3] == [
        ("ImprovedDilatedAttention", 256, "ok"),
        ("ImprovedDilatedAttention", 512, "oom"),
        ("ImprovedDilatedAttention", 1024, "skipped"),
    ]
    assert result.rows[2].reason == "after oom at N=512"
    assert ("sdpa", 256) in runner.calls and ("ImprovedDilatedAttention", 1024) not in runner.calls


def test_predicted_memory_above_cap_is_skipped_without_running():
    cfg = Sweep(impls=["math"], seq_lens=[65536], **{**BASE, "max_memory": 2**30})
    runner = Runner()
    result = run_sweep(cfg, runner=runner, predict=predicted_peak_bytes)
    assert runner.calls == []
    row = result.rows[0]
    assert row.status == "skipped" and row.reason.startswith("memory: predicted") and row.predicted_mem_bytes > 2**30


def test_resume_measures_nothing_twice(tmp_path):
    out = tmp_path / "r.jsonl"
    cfg = Sweep(impls=["ImprovedDilatedAttention"], seq_lens=[256, 512, 1024, 2048], **BASE)

    class Interrupted(Runner):
        def __call__(self, sweep, problem):
            if len(self.calls) == 2:
                raise KeyboardInterrupt
            return super().__call__(sweep, problem)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, out=out, runner=Interrupted())
    first = read_rows(out)
    assert [r.seq_len for r in first] == [256, 512]
    with pytest.raises(ValueError, match="pass --resume"):
        run_sweep(cfg, out=out, runner=Runner())
    runner = Runner()
    result = run_sweep(cfg, out=out, resume=True, runner=runner)
    assert runner.calls == [("ImprovedDilatedAttention", 1024), ("ImprovedDilatedAttention", 2048)]
    rows = read_rows(out)
    assert [r.seq_len for r in rows] == [256, 512, 1024, 2048] and len({r.key() for r in rows}) == 4
    assert [r.seq_len for r in result.rows] == [256, 512, 1024, 2048]


def test_torn_last_line_is_ignored(tmp_path):
    out = tmp_path / "r.jsonl"
    sweep = Sweep(impls=["sdpa"], seq_lens=[1], **BASE)
    row = BenchRow(status="ok", **row_fields(sweep.point("sdpa", 1)))
    out.write_text(row.model_dump_json() + "\n" + '{"record": "point", "impl": "sd')
    assert len(read_rows(out)) == 1


@pytest.mark.parametrize("limit", [10_000, 5_000, 70_000])
def test_until_oom_doubles_then_bisects_to_5_percent(limit):
    cfg = Sweep(impls=["ImprovedDilatedAttention"], until_oom=True, start=1024, **BASE)
    runner = Runner(limit=limit)
    result = run_sweep(cfg, runner=runner)
    best = result.summaries[0].max_ok_seq_len
    failing = min(n for _, n in runner.calls if n > limit)
    assert best <= limit < failing and failing - best <= 0.05 * failing
    summary = result.summaries[0]
    assert summary.stopped_by == "memory" and summary.stopped_at == failing
    assert summary.limit.startswith(f"stopped by memory (oom) at N={failing:,}")
    assert summary.summary.startswith(f"max N {best:,}; stopped by memory (oom)")
    assert len(runner.calls) == len(set(runner.calls))  # no point measured twice


def test_until_oom_stops_at_an_error_without_bisecting():
    cfg = Sweep(impls=["sdpa"], until_oom=True, start=1024, **BASE)

    def runner(sweep, problem):
        n = problem.seq_len
        return ok_result(n) if n < 4096 else {"status": "error", "reason": "exception in worker", "error": "boom"}

    result = run_sweep(cfg, runner=runner)
    summary = result.summaries[0]
    assert summary.max_ok_seq_len == 2048 and summary.stopped_by == "error"
    assert summary.limit == "stopped by an error at N=4,096: boom"
    assert [r.seq_len for r in result.rows] == [1024, 2048, 4096]


def time_skip(n):
    return {
        "status": "skipped",
        "reason": f"time: one call took {n / 1000:.2f} s, so 3 repeats would exceed --max-seconds 1",
    }


@pytest.mark.parametrize("until_oom", [True, False])
def test_a_time_skip_stops_the_search_and_is_reported_as_time_not_memory(until_oom):
    lengths = {"until_oom": True, "start": 1024} if until_oom else {"seq_lens": [1024, 2048, 4096, 8192]}
    cfg = Sweep(impls=["ImprovedDilatedAttention"], **lengths, **BASE)
    calls = []

    def runner(sweep, problem):
        calls.append(problem.seq_len)
        return ok_result(problem.seq_len) if problem.seq_len <= 2048 else time_skip(problem.seq_len)

    summary = run_sweep(cfg, runner=runner).summaries[0]
    assert calls == [1024, 2048, 4096]  # no bisection between 2048 and 4096: time is not a memory limit
    assert (summary.max_ok_seq_len, summary.stopped_by, summary.stopped_at) == (2048, "time", 4096)
    assert summary.summary == "max N 2,048; stopped by --max-seconds at N=4,096, not by memory"


def test_a_prediction_skip_is_bisected_towards_and_named_as_predicted():
    cfg = Sweep(impls=["ImprovedDilatedAttention"], until_oom=True, start=1024, **BASE)
    runner = Runner()

    def predict(problem):  # far above the 1 GiB cap above N=6000
        return 2**20 if problem.seq_len <= 6000 else 2**32

    summary = run_sweep(cfg, runner=runner, predict=predict).summaries[0]
    assert all(n <= 6000 for _, n in runner.calls)  # nothing predicted over the cap was run
    assert summary.stopped_by == "prediction" and summary.max_ok_seq_len <= 6000 < summary.stopped_at
    assert summary.stopped_at - summary.max_ok_seq_len <= 0.05 * summary.stopped_at  # bisected to 5%
    assert summary.limit.startswith(f"stopped by the predicted memory at N={summary.stopped_at:,} (predicted 4.00 GiB")
    assert summary.limit.endswith("not measured") and "oom" not in summary.summary


def test_a_time_skip_while_bisecting_stops_there_and_names_the_oom_above():
    cfg = Sweep(impls=["ImprovedDilatedAttention"], until_oom=True, start=1024, **BASE)

    def runner(sweep, problem):
        n = problem.seq_len
        if n <= 4096:
            return ok_result(n)
        return {"status": "oom", "reason": "out of memory"} if n >= 8192 else time_skip(n)

    result = run_sweep(cfg, runner=runner)
    summary = result.summaries[0]
    assert [r.seq_len for r in result.rows] == [1024, 2048, 4096, 8192, 6144]
    assert (summary.max_ok_seq_len, summary.stopped_by, summary.stopped_at) == (4096, "time", 6144)
    assert summary.limit == "stopped by --max-seconds at N=6,144, not by memory; oom at N=8,192"


def test_until_oom_that_never_fails_says_so():
    cfg = Sweep(impls=["ImprovedDilatedAttention"], until_oom=True, start=64, **BASE)
    summary = run_sweep(
        cfg, runner=lambda sweep, problem: {**ok_result(problem.seq_len), "peak_mem_bytes": 1}
    ).summaries[0]
    assert summary.stopped_by == "doublings" and summary.max_ok_seq_len == 64 * 2**23
    assert summary.stopped_at is None and "24 doublings" in summary.limit


def test_summaries_carry_the_fitted_exponents():
    cfg = Sweep(impls=["ImprovedDilatedAttention", "sdpa"], seq_lens=[256, 512, 1024], **BASE)

    def runner(sweep, problem):  # sdpa quadratic in time, linear in memory
        n = problem.seq_len
        return {**ok_result(n), "time_ms": n * n / 1e4} if problem.impl == "sdpa" else ok_result(n)

    improved, sdpa = run_sweep(cfg, runner=runner).summaries
    assert improved.time_exponent == pytest.approx(1.0) and improved.memory_exponent == pytest.approx(1.0)
    assert (
        sdpa.time_exponent == pytest.approx(2.0) and sdpa.stopped_by is None and sdpa.summary == "max N 1,024; all ok"
    )


def test_a_report_ends_with_the_load_at_the_end_of_the_run(tmp_path):
    import json

    from dattn_cli.bench.sweep import run_sweep

    out = tmp_path / "r.jsonl"
    result = run_sweep(_end_sweep(), out=out, runner=lambda sweep, problem: {"status": "skipped", "reason": "test"})
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["record"] for r in records] == ["environment", "point", "run_end"]
    assert records[-1]["load_average"] == result.environment["load_average_end"]
    assert result.environment["load_average"] is not None  # the start's, from the environment record


def _end_sweep():
    from dattn_cli.bench import Sweep

    return Sweep(
        impls=["sdpa"],
        seq_lens=[256],
        heads=2,
        head_dim=16,
        segment_lengths=[64, 128],
        dilation_rates=[1, 2],
        max_memory=2**30,
        mode="fwd",
    )
