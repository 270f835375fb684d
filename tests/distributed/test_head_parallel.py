"""Head-parallel attention on gloo process groups: equals the single-process reference; bytes as computed."""

import time

import pytest
import torch

from dattn_cli.kernels import dilated_attention_reference
from dattn_cli.runtime.launch import DistributedError, run_distributed
from tests.conftest import rel_err
from tests.distributed import workers


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_concatenated_shards_equal_the_reference(world):
    per_rank = run_distributed(workers.head_parallel_cases, world, timeout_s=120)
    B, N, H, D = workers.SHAPE.values()
    for i, (sem, causal, segs, rates) in enumerate(workers.CASES):
        q, k, v, upstream = (x.clone().requires_grad_(j < 3) for j, x in enumerate(workers.full_inputs(i)))
        ref, _ = dilated_attention_reference(q, k, v, segs, rates, causal, sem)
        ref_grads = torch.autograd.grad(ref, (q, k, v), upstream)
        out = torch.cat([r[i]["out"] for r in per_rank], dim=1)
        assert rel_err(out, ref) <= 1e-5, (world, sem, causal, segs)
        for j in range(3):
            grad = torch.cat([r[i]["grads"][j] for r in per_rank], dim=1)
            assert rel_err(grad, ref_grads[j]) <= 1e-4, (world, sem, causal, segs, j)
        shard_bytes = B * (N // world) * H * D * 4
        expected = 4 * shard_bytes * (world - 1) // world  # q, k, v in; out back (docs/communication.md)
        for r in per_rank:
            comm = r[i]["comm"]
            if world == 1:
                assert comm["forward_calls"] == 0 and comm["forward_bytes_sent"] == 0
            else:
                assert comm["forward_bytes_sent"] == comm["forward_bytes_received"] == expected
                assert comm["backward_bytes_sent"] == comm["backward_bytes_received"] == expected


def test_a_failing_rank_ends_every_rank_with_its_name():
    began = time.monotonic()
    with pytest.raises(DistributedError, match="rank 1 failed: RuntimeError: deliberate failure"):
        run_distributed(workers.fail_on_rank_one, 3, timeout_s=30)
    assert time.monotonic() - began < 30


def test_mismatched_shards_are_detected_up_front():
    with pytest.raises(DistributedError, match="ranks disagree on shard shape"):
        run_distributed(workers.mismatched_shapes, 2, timeout_s=30)


def test_heads_not_divisible_by_world_size():
    with pytest.raises(DistributedError, match="6 heads cannot be split over 4 ranks"):
        run_distributed(_six_heads, 4, timeout_s=30)


def _six_heads(rank, world):
    from dattn_cli.kernels import HeadParallelDilatedAttention

    q = torch.randn(1, 8, 6, 4)
    return HeadParallelDilatedAttention([8], [1])(q, q, q)


@pytest.mark.slow
def test_verify_world_sizes_from_the_cli(tmp_path, capsys):
    import json

    from tests.cli.test_verify_env import run_cli

    report = tmp_path / "v.json"
    code, out, err = run_cli(
        ["verify", "--world-size", "1,2,4", "--semantics", "longnet", "--causal", "--json", str(report)], capsys
    )
    assert code == 0, out + err
    rows = json.loads(report.read_text())["results"]
    by_world = {w: [r for r in rows if r["world_size"] == w] for w in (1, 2, 4)}
    assert all(by_world[w] for w in (1, 2, 4))
    assert {r["impl"] for r in rows} == {
        "HeadParallelDilatedAttention",
        "HeadParallelMultiheadDilatedAttention",
        "HybridDilatedAttention",
        "HybridMultiheadDilatedAttention",
        "RingDilatedAttention",
        "RingMultiheadDilatedAttention",
        "DistributedImprovedDilatedAttention",
        "DistributedImprovedMultiheadDilatedAttention",
        "BlockSparseRingDilatedAttention",
        "BlockSparseRingMultiheadDilatedAttention",
    }
    assert all(r["passed"] for r in rows)
    assert max(e["rel"] for r in by_world[4] for name, e in r["errors"].items() if name.startswith("d")) <= 1e-4
    assert all(r["comm"] and len(r["comm"]) == r["world_size"] for r in rows)
