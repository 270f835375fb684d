"""Distributed verify on the device it was asked for (issue 18, item 7): the checks keep the grid's device,
a spawned group on CUDA uses "cpu:gloo,cuda:nccl" (gloo on CPU), each rank takes its own GPU, results come
back as CPU tensors and are compared on the reference's device. The CUDA runs themselves skip without a GPU."""

import pytest
import torch

from dattn_cli.verify import distributed
from dattn_cli.verify.cases import case_matrix
from dattn_cli.verify.checks import group_checks
from dattn_cli.verify.references import ReferenceCache
from dattn_cli.verify.variants import Grid

IMPL = "RingDilatedAttention"


def _checks(device: str) -> list:
    grid = Grid(
        semantics=["longnet"], causal=[False], backends=["auto"], patterns=["longnet"], dtype="float32", device=device
    )
    return group_checks(IMPL, 2, case_matrix()[:1], grid, [])


@pytest.mark.parametrize("device, expected", [("cpu", "gloo"), ("cuda", "cpu:gloo,cuda:nccl")])
def test_spawned_group_backend_follows_the_device(monkeypatch, device, expected):
    used = {}

    def fake_run(fn, world, jobs, backend, timeout_s):
        used["backend"], used["devices"] = backend, {j[0]["device"] for j in jobs}
        raise RuntimeError("stopped here")

    monkeypatch.setattr(distributed, "run_distributed", fake_run)
    monkeypatch.setattr(distributed, "attach_backend", lambda: "cpu:gloo,cuda:nccl")
    checks = _checks(device)
    assert checks and all(v.problem.device == device for v in checks)
    results = distributed.verify_group(IMPL, 2, checks, ReferenceCache(0), 10.0)
    assert used == {"backend": expected, "devices": {device}}
    assert all(not r.passed and "stopped here" in r.message for r in results)


@pytest.mark.parametrize("local_rank, rank, gpu", [(None, 1, 1), ("3", 0, 1), ("0", 1, 0), (None, 2, 0)])
def test_each_rank_takes_its_local_gpu(monkeypatch, local_rank, rank, gpu):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    problem = _checks("cuda")[0].problem
    assert distributed._on_rank_device(problem, rank).device == f"cuda:{gpu}"
    assert chosen == [gpu]
    cpu = _checks("cpu")[0].problem
    assert distributed._on_rank_device(cpu, rank) is cpu and chosen == [gpu]


def test_combine_moves_the_shards_to_the_reference_device():
    per_rank = [
        [{"out": torch.ones(1, 3, 1, 1), "dx": torch.ones(1, 3, 1, 1), "dparams": torch.ones(2), "seq_len": 5}]
        for _ in range(2)
    ]
    got = distributed.combine(True, per_rank, 0, "meta")
    assert {t.device.type for t in got.values()} == {"meta"}
    assert got["out"].shape[1] == 5 and got["dparams"].shape == (2,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ring_on_gpus_with_nccl_matches_the_reference():
    results = distributed.verify_group(IMPL, 1, _checks_world("cuda", 1), "float32", 0, 120.0)
    assert results and all(r.passed for r in results), [r.message for r in results]


def _checks_world(device: str, world: int) -> list:
    grid = Grid(
        semantics=["longnet"],
        causal=[False, True],
        backends=["auto"],
        patterns=["longnet"],
        dtype="float32",
        device=device,
    )
    return group_checks(IMPL, world, case_matrix()[:2], grid, [])


def test_cuda_groups_need_a_gpu_per_rank(monkeypatch):
    from dattn_cli.runtime.limits import check_spawned_ranks
    from dattn_cli.verify.run import collect_checks

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_spawned_ranks(1, device="cuda")
    with pytest.raises(ValueError, match=r"--world-size 2 on cuda: NCCL needs one GPU per rank .* has 1"):
        check_spawned_ranks(2, device="cuda")
    with pytest.raises(ValueError, match="one GPU per rank"):
        collect_checks([IMPL], world_sizes=[1, 2], device="cuda")
