"""Isolation: every way a point can fail becomes a row; a real point has every field."""

import pytest

from dattn_cli.bench import Sweep
from dattn_cli.bench.point import CPU_MEM_METHOD
from dattn_cli.bench.worker import run_isolated
from dattn_cli.workload.counts import total_flops
from tests.bench import helpers

SMALL = dict(
    seq_lens=[512],
    heads=2,
    head_dim=16,
    segment_lengths=[64, 128],
    dilation_rates=[1, 2],
    repeat=2,
    max_memory=2**30,
    max_seconds=60,
)


def cfg(**kw):
    return Sweep(**{"impls": ["ImprovedDilatedAttention"], **SMALL, **kw})


def point(sweep, impl, n):
    return sweep, sweep.point(impl, n)


def flops_for(impl, sweep, n):
    return total_flops(sweep.point(impl, n))


@pytest.mark.parametrize(
    "impl",
    ["ImprovedDilatedAttention", "DilatedAttention", "ImprovedMultiheadDilatedAttention", "sdpa", "math", "reference"],
)
@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
def test_real_point_measures_everything(impl, mode):
    c = cfg(mode=mode)
    row = run_isolated(*point(c, impl, 512))
    assert row["status"] == "ok", row
    assert row["time_ms"] > 0 and row["time_ms_p10"] <= row["time_ms"] <= row["time_ms_p90"]
    assert row["tokens_per_s"] == pytest.approx(512 / (row["time_ms"] / 1e3))
    assert row["flops"] == flops_for(impl, c, 512) and row["tflops"] > 0
    assert row["peak_mem_bytes"] > 512 * 2 * 16 * 4 * 3  # at least the three inputs
    assert row["mem_method"] == CPU_MEM_METHOD
    assert row["block_kernel"] == ("cpu-flash" if "Dilated" in impl else None)  # the dense baselines use none
    assert row["merge_path"] == ("accumulating" if "Dilated" in impl else None)  # the one-pass combine: CUDA only
    assert row["first_call_ms"] > 0


def test_flop_convention():
    c = cfg()
    dense = 4 * 16 * 2 * 512 * 512
    assert flops_for("sdpa", c, 512) == dense
    assert flops_for("sdpa", cfg(causal=True), 512) == 4 * 16 * 2 * 512 * 513 // 2
    assert flops_for("sdpa", cfg(mode="fwdbwd"), 512) == 3.5 * dense
    # pair 1: 64 keys per query; pair 2 (r=2): half the queries, 64 keys each -> 96 per query and head
    assert flops_for("ImprovedDilatedAttention", c, 512) == 4 * 16 * 2 * 512 * 96


@pytest.mark.parametrize(
    "child,status,needle",
    [
        (helpers.raising_child, "error", "--impl 'no-such-impl' is unknown"),
        (helpers.memory_error_child, "oom", "MemoryError"),
        (helpers.killed_child, "oom", "SIGKILL"),
        (helpers.crashing_child, "error", "exited with code 3"),
    ],
)
def test_failures_become_rows(child, status, needle):
    row = run_isolated(*point(cfg(), "ImprovedDilatedAttention", 512), child=child)
    assert row["status"] == status and needle in row["error"]


@pytest.mark.slow
def test_time_budget_kills_a_hung_worker():
    row = run_isolated(*point(cfg(max_seconds=0.5), "ImprovedDilatedAttention", 512), child=helpers.sleeping_child)
    assert row["status"] == "skipped" and row["reason"].startswith("time")


def test_time_budget_skips_slow_points_after_one_call():
    row = run_isolated(*point(cfg(max_seconds=0.001, repeat=50), "sdpa", 512))
    assert row["status"] == "skipped" and row["reason"].startswith("time: one call took")


def test_memory_cap_is_enforced_inside_torch():
    # math holds 2 x B*H*N*N*4 bytes = 1 GiB of scores at N=8192, H=2: far over a 256 MiB cap
    row = run_isolated(*point(cfg(max_memory=256 * 2**20), "math", 8192))
    assert row["status"] == "oom" and "alloc" in row["error"].lower()


def test_memory_watchdog_kills_what_rlimit_does_not_stop():
    row = run_isolated(*point(cfg(max_memory=128 * 2**20), "ImprovedDilatedAttention", 512), child=helpers.hog_child)
    assert row["status"] == "oom" and "x --max-memory; killed" in row["error"]


CAP_CHILD = """
import resource
from dattn_cli.runtime.limits import RLIMIT_SLACK, cap_address_space
from dattn_cli.runtime.measure import vm_bytes
base = vm_bytes()
cap_address_space(2**30)
first = resource.getrlimit(resource.RLIMIT_AS)[0]
cap_address_space(2**30, 2)
second = resource.getrlimit(resource.RLIMIT_AS)[0]
print(first - base - RLIMIT_SLACK, second - first)
"""


def test_timed_calls_get_twice_the_cap_once_the_memory_call_fitted():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CAP_CHILD], capture_output=True, text=True, check=True)
    first, raised = map(int, done.stdout.split())
    assert abs(first - 2**30) < 2**20  # the cap (+ slack) over the worker's address space when first capped
    assert raised == 2**30  # the timed calls: one more --max-memory, from the same base


def test_the_worker_runs_with_the_sweeps_threads(monkeypatch):
    import multiprocessing

    import torch

    from dattn_cli.bench import worker

    sweep = cfg(threads=1)
    seen = []
    monkeypatch.setattr(worker, "cap_memory", lambda limit, device: None)  # in this process: no cap
    monkeypatch.setattr(worker, "measure_point", lambda *a: seen.append(torch.get_num_threads()) or {"status": "ok"})
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        parent, child = multiprocessing.Pipe()
        worker._child(child, sweep.model_dump(), sweep.point("ImprovedDilatedAttention", 512).model_dump())
        assert parent.recv().model_dump(exclude_unset=True) == {"status": "ok"} and seen == [1]  # a PointResult
    finally:
        torch.set_num_threads(before)
    assert Sweep(**{"impls": ["sdpa"], **SMALL}).threads >= 1  # resolved when not given
    with pytest.raises(ValueError, match="--threads must be an integer from 1"):
        cfg(threads=0)
