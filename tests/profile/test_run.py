"""dattn_cli.profile.run_profile: caches on vs off, stats, timing, memory, trace, input checks."""

import json
import re

import pytest
import torch
from pydantic import ValidationError

from dattn_cli.profile import ProfileReport, block_table_for, run_profile
from dattn_cli.workload.problem import Problem

SHAPE = dict(seq_len=256, heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2])
RUN = dict(iterations=3, warmup=1)
CACHE_KEYS = {"hits", "misses", "evictions", "hit_rate", "entries", "bytes"}
POOL_KEYS = {"requests", "reuses", "reuse_rate", "bytes_held", "peak_bytes_held"}


def problem(impl: str = "ImprovedDilatedAttention", **changes) -> Problem:
    return Problem(impl=impl, **{**SHAPE, **changes})


def one_line(exc: ValueError) -> str:
    """The sentence the CLI prints: a pydantic error's message with its field, else the text."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        return f"{field}: {error['msg']}" if field else error["msg"]
    return str(exc)


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    return run_profile(problem(), **RUN)


def test_caches_on_hit_and_reuse(report):
    on = report.caches_on
    assert on.use_pattern_cache and on.enable_memory_pool
    # 2 pairs, 4 calls: the first call misses each pair once, the other 3 hit.
    assert on.calls == 4
    assert on.pattern_cache.misses == 2 and on.pattern_cache.hits == 6
    assert on.pattern_cache.hit_rate == pytest.approx(0.75)
    assert on.pattern_cache.entries == 2
    assert on.memory_pool.requests > 0 and on.memory_pool.reuses > 0
    assert 0 < on.memory_pool.reuse_rate < 1  # the first call's buffers are new, later ones reused
    assert on.memory_pool.peak_bytes_held > 0


def test_caches_off_touch_neither(report):
    off = report.caches_off
    assert not off.use_pattern_cache and not off.enable_memory_pool
    assert off.pattern_cache.hits + off.pattern_cache.misses == 0
    assert off.pattern_cache.entries == 0
    assert off.memory_pool.requests == 0 and off.memory_pool.peak_bytes_held == 0
    assert report.notes == []


def test_all_stat_keys_present(report):
    dumped = report.model_dump()
    for name in ("caches_on", "caches_off"):
        setting = dumped[name]
        assert CACHE_KEYS <= setting["pattern_cache"].keys()
        assert POOL_KEYS <= setting["memory_pool"].keys()
        assert {"median_ms", "p10_ms", "p90_ms"} <= setting["time"].keys()
        assert {"memory_method", "peak_bytes", "peak_above_baseline_bytes"} <= setting["memory"].keys()
    assert {"torch_version", "device_name"} <= dumped["environment"].keys()
    assert dumped["environment"]["torch_version"] == torch.__version__
    assert dumped["config"]["problem"]["seq_len"] == 256 and dumped["config"]["problem"]["segment_lengths"] == [64, 128]
    assert {k: dumped["config"][k] for k in RUN} == RUN and dumped["config"]["seed"] == 0
    assert report.trace_path is None and report.trace_iterations == 0
    json.loads(report.model_dump_json())  # serialisable as it is


def test_times_are_positive_and_ordered(report):
    for setting in (report.caches_on, report.caches_off):
        t = setting.time
        assert len(t.samples_ms) == RUN["iterations"]
        assert all(s > 0 for s in t.samples_ms)
        assert 0 < t.p10_ms <= t.median_ms <= t.p90_ms
        assert min(t.samples_ms) <= t.p10_ms and t.p90_ms <= max(t.samples_ms)
    assert report.speedup_on_vs_off == pytest.approx(report.caches_off.time.median_ms / report.caches_on.time.median_ms)


def test_cpu_memory_is_measured_and_named(report):
    for setting in (report.caches_on, report.caches_off):
        mem = setting.memory
        assert "VmHWM" in mem.memory_method
        assert mem.cuda_allocator is None
        assert mem.baseline_bytes > 0 and mem.peak_bytes >= mem.baseline_bytes
        assert mem.peak_above_baseline_bytes == mem.peak_bytes - mem.baseline_bytes


def test_fwdbwd_runs_backward():
    report = run_profile(problem(mode="fwdbwd", causal=True), **RUN)
    assert report.config.problem.mode == "fwdbwd" and report.config.problem.causal
    on, off = report.caches_on, report.caches_off
    assert on.pattern_cache.hits > 0 and off.pattern_cache.hits + off.pattern_cache.misses == 0
    fwd_only = run_profile(problem(causal=True), **RUN)
    # backward takes pooled scratch as well, so it asks the pool for more buffers than forward alone
    assert on.memory_pool.requests > fwd_only.caches_on.memory_pool.requests
    assert on.time.median_ms > 0 and off.time.median_ms > 0


def test_multihead_impl():
    report = run_profile(problem("ImprovedMultiheadDilatedAttention", mode="fwdbwd"), **RUN)
    assert report.config.problem.spec.kind == "multihead" and report.config.problem.width == 32
    assert report.caches_on.pattern_cache.hits > 0
    assert report.caches_on.pattern_cache.hit_rate > 0
    assert report.caches_off.pattern_cache.hits + report.caches_off.pattern_cache.misses == 0
    assert report.caches_off.memory_pool.requests == 0


def test_index_gathering_impl_notes_unused_pool():
    report = run_profile(problem("DilatedAttention"), **RUN)
    assert report.caches_on.pattern_cache.hits > 0
    assert report.caches_on.pattern_cache.bytes > 0  # its plans hold index tensors
    assert report.caches_on.memory_pool.requests == 0
    assert any("memory pool was not used" in note for note in report.notes)


def test_trace_is_written(tmp_path):
    path = tmp_path / "t.json"
    report = run_profile(problem(), trace=path, **RUN)
    assert report.trace_path == str(path) and report.trace_iterations > 0
    assert path.stat().st_size > 0
    trace = json.loads(path.read_text())
    assert trace["traceEvents"]
    # the trace runs after the statistics are read: the caches-on counts are those of the timed calls
    assert report.caches_on.pattern_cache.hits == 6


def test_inputs_are_random_not_zeros(monkeypatch):
    from dattn_cli.profile import work

    seen = []
    original = work.Workload.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append([t.detach().clone() for t in self.inputs])

    monkeypatch.setattr(work.Workload, "__init__", spy)
    run_profile(problem(), **RUN)
    assert len(seen) >= 2
    for tensors in seen:
        q, k, v = tensors
        assert q.abs().sum() > 0 and not torch.equal(q, k) and not torch.equal(k, v)
    for a, b in zip(seen[-2], seen[-1]):  # both settings see the same seeded inputs
        assert torch.equal(a, b)


def test_caller_rng_state_is_kept():
    torch.manual_seed(123)
    expected = torch.randn(4)
    torch.manual_seed(123)
    run_profile(problem(), **RUN)
    assert torch.equal(torch.randn(4), expected)


def test_block_sparse_pattern_comes_from_the_problem():
    p = problem("BlockSparseRingDilatedAttention", pattern="local", block_size=32, window=1)
    report = run_profile(p, **RUN)
    assert report.block_pattern is not None and report.block_pattern.label == "local(w=1,b=32)"
    assert report.block_pattern == report.caches_on.block_pattern
    table = block_table_for(p)
    assert table.shape == (8, 8) and table.float().mean().item() == pytest.approx(report.block_pattern.block_density)
    with pytest.raises(ValueError, match="--show-pattern"):
        block_table_for(problem())


@pytest.mark.parametrize(
    "changes, parameter",
    [
        ({"impl": "NoSuchAttention"}, "--impl"),
        ({"seq_len": 0}, "--seq-len"),
        ({"batch": -1}, "--batch"),
        ({"heads": 0}, "--heads"),
        ({"head_dim": 0}, "--head-dim"),
        ({"dtype": "float8"}, "dtype"),
        ({"mode": "bwd"}, "mode"),
        ({"segment_lengths": [64, 0]}, "segment_lengths"),
        ({"dilation_rates": [1]}, "dilation_rates"),
        ({"semantics": "nope"}, "semantics"),
        ({"impl": "BlockSparseRingDilatedAttention", "pattern": "nope"}, "--pattern"),
    ],
)
def test_bad_problem_raises_naming_the_parameter(changes, parameter):
    with pytest.raises(ValueError) as info:
        run_profile(problem(**changes), **RUN)
    message = one_line(info.value)
    assert re.search(re.escape(parameter), message) and "\n" not in message


@pytest.mark.parametrize(
    "changes, settings, parameter",
    [
        ({}, {"iterations": 0}, "--iterations"),
        ({}, {"warmup": -1}, "--warmup"),
        ({"device": "tpu"}, {}, "--device"),
        ({}, {"trace": "/no/such/dir/t.json"}, "--trace"),
        ({"impl": "RingDilatedAttention", "world_size": 2}, {}, "--world-size"),
    ],
)
def test_bad_settings_raise_naming_the_parameter(changes, settings, parameter):
    with pytest.raises(ValueError) as info:
        run_profile(problem(**changes), **{**RUN, **settings})
    message = one_line(info.value)
    assert parameter in message and "\n" not in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
def test_cuda_without_cuda_names_device():
    with pytest.raises(ValueError, match="--device 'cuda' but CUDA is not available"):
        run_profile(problem(device="cuda"), **RUN)
