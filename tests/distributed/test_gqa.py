"""GQA/MQA on every distributed form, gloo: shards equal the dense reference (forward, lse, gradients) at
p = 2 and 4 with H = 8 and H_kv in {8, 2, 1}; K/V bytes move at the kv heads and equal the formulas."""

import pytest
import torch

from dattn_cli.kernels import block_sparse_reference, dilated_attention_reference
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume
from dattn_cli.runtime.launch import run_distributed
from dattn_cli.workload import Problem
from dattn_cli.workload.counts import head_parallel_traffic, sequence_parallel_traffic
from tests.conftest import rel_err
from tests.distributed import gqa_workers as w

IMPLS = [
    "RingDilatedAttention",
    "DistributedImprovedDilatedAttention",
    "HeadParallelDilatedAttention",
    "BlockSparseRingDilatedAttention",
]
STRATEGY = {"RingDilatedAttention": "ring", "DistributedImprovedDilatedAttention": "allgather"}
KEYS = ("forward_bytes_sent", "forward_bytes_received", "backward_bytes_sent", "backward_bytes_received")


def _reference(impl: str, kv_heads: int, causal: bool):
    q, k, v, up = w.inputs(kv_heads, causal)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if impl.startswith("BlockSparse"):
        table = w.module_for(impl).block_table(w.N, w.H)
        out, lse = block_sparse_reference(q, k, v, table, w.BLOCK, causal)
    else:
        out, lse = dilated_attention_reference(q, k, v, w.SEGS, w.RATES, causal)
    return out, lse, torch.autograd.grad(out, (q, k, v), up)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("impl", IMPLS)
def test_gqa_shards_equal_the_reference(impl, world):
    per_rank = run_distributed(w.gqa_cases, world, impl, timeout_s=180)
    for kv_heads, causal in per_rank[0]:
        out, lse, grads = _reference(impl, kv_heads, causal)
        join = lambda key, j=None: torch.cat(
            [
                r[kv_heads, causal][key]
                if j is None  # noqa: E731
                else r[kv_heads, causal][key][j]
                for r in per_rank
            ],
            1,
        )
        where = (impl, world, kv_heads, causal)
        assert rel_err(join("out"), out) <= 1e-10 and rel_err(join("lse"), lse) <= 1e-6, where
        for j in range(3):
            assert join("grads", j).shape == grads[j].shape and rel_err(join("grads", j), grads[j]) <= 1e-10, (where, j)
        comm = [{k: r[kv_heads, causal]["comm"][k] for k in KEYS} for r in per_rank]
        if impl in STRATEGY:
            assert comm == comm_volume(
                STRATEGY[impl], w.N, world, w.B, w.H, w.D, 8, w.SEGS, w.RATES, is_causal=causal, num_kv_heads=kv_heads
            ), where
        if impl.startswith("HeadParallel"):  # q, out at H heads, k, v at lcm(H_kv, p); fwd + bwd, no lse moved
            problem = Problem(
                impl=impl,
                seq_len=w.N,
                heads=w.H,
                kv_heads=kv_heads,
                head_dim=w.D,
                batch=w.B,
                dtype="float64",
                world_size=world,
                mode="fwdbwd",
                segment_lengths=w.SEGS,
                dilation_rates=w.RATES,
            )
            for c in comm:  # lse goes back too (forward_with_lse): one (B, N/p, H, 1) float64 all-to-all
                lse_bytes = w.B * (w.N // world) * w.H * 8 * (world - 1) // world
                assert (
                    c["forward_bytes_sent"] + c["backward_bytes_sent"] - lse_bytes == head_parallel_traffic(problem)[0]
                )


def test_kv_bytes_at_p4_drop_with_the_kv_heads():
    """Ring and all-gather at p = 4, H = 8: the K/V bytes of H_kv = 2 against H_kv = 8 are each head set's share of
    distinct kv heads: 1/4 for r = 1 pairs; 1/2 for r = 2 (offset o's heads o, o + 2, o + 4, o + 6 use two kv
    heads, not four); for r = 3 the sets {0,3,6} {1,4,7} {2,5} carry 2 + 2 + 2 kv heads for 8 query heads."""
    for strategy in ("ring", "allgather"):
        for rates, share in (([1, 1], 1 / 4), ([2, 2], 1 / 2), ([3, 3], 6 / 8)):
            full = comm_volume(strategy, 96, 4, 2, 8, 8, 4, [48, 96], rates)
            gqa = comm_volume(strategy, 96, 4, 2, 8, 8, 4, [48, 96], rates, num_kv_heads=2)
            for rank in range(4):
                for key in KEYS:
                    assert gqa[rank][key] == share * full[rank][key] and full[rank][key] > 0, (strategy, rates, key)
    p = Problem(
        impl="RingDilatedAttention",
        seq_len=96,
        heads=8,
        head_dim=8,
        batch=2,
        world_size=4,
        segment_lengths=[48, 96],
        dilation_rates=[1, 1],
        mode="fwdbwd",
    )
    assert sequence_parallel_traffic(p)[0] == 4 * sequence_parallel_traffic(p.with_(kv_heads=2))[0]
    assert (
        sequence_parallel_traffic(p.with_(dilation_rates=[2, 2]))[0]
        == 2 * sequence_parallel_traffic(p.with_(dilation_rates=[2, 2], kv_heads=2))[0]
    )
