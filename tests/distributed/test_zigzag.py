"""Zigzag shards (layout="zigzag") on gloo ranks: the ring and all-gather classes equal the dense reference,
forward and gradients (causal and not, dilation, GQA, key padding masks, N not divisible by 2p), and each
rank's bytes equal comm_volume(..., layout="zigzag")."""

import pytest
import torch

from dattn_cli.kernels import dilated_attention_reference, padded_length
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume
from dattn_cli.kernels.distributed.sharding import join_shards
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import zigzag_workers as zw

STRATEGY = {"RingDilatedAttention": "ring", "DistributedImprovedDilatedAttention": "allgather"}


def _joined(per_rank, key, case, n, index=None):
    shards = [r[case][key] if index is None else r[case][key][index] for r in per_rank]
    return join_shards(shards, n, layout="zigzag")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("impl", list(STRATEGY))
def test_zigzag_shards_equal_the_reference_and_bytes_equal_the_formula(impl, world):
    per_rank = run_distributed(zw.zigzag_cases, world, impl, timeout_s=300)
    for case in per_rank[0]:
        c, i = case
        N, H, KV, segs, rates = zw.CASES[c]
        sem, causal, _ = zw.VARIANTS[i]
        q, k, v, up, mask = zw.inputs(c, i)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        ref, ref_lse = dilated_attention_reference(q, k, v, segs, rates, causal, sem, key_padding_mask=mask)
        ref_grads = torch.autograd.grad(ref, (q, k, v), up)
        where = (impl, world, case)
        assert rel_err(_joined(per_rank, "out", case, N), ref) <= 1e-5, where
        assert rel_err(_joined(per_rank, "lse", case, N), ref_lse) <= 1e-5, where
        for j in range(3):
            assert rel_err(_joined(per_rank, "grads", case, N, j), ref_grads[j]) <= 1e-4, (where, j)
        padded = padded_length(N, world, segs, layout="zigzag")
        masked = per_rank[0][case]["masked"]
        expected = comm_volume(
            STRATEGY[impl], padded, world, zw.B, H, zw.D, 4, segs, rates, sem, causal, masked, KV, "zigzag"
        )
        for rank, r in enumerate(per_rank):
            comm = {key: value for key, value in r[case]["comm"].items() if key != "forward_calls"}
            assert comm == expected[rank], (where, rank)
            assert sum(comm.values()) > 0, (where, rank)  # every case spans chunks: bytes really move


def test_zigzag_ring_volume_by_hand():
    # N=48, p=2: 4 chunks of 12; ŵ = 48 spans them all, each rank's buffer holds both its chunks (24 rows,
    # H=2, r=1); causal or not, the one other rank's buffer arrives once forward, and backward again plus
    # the dK/dV shares of this rank's rows coming home
    buffer = 2 * 2 * 2 * 24 * 8 * 4
    for causal in (False, True):
        for counts in comm_volume("ring", 48, 2, 2, 2, 8, 4, [48], [1], is_causal=causal, layout="zigzag"):
            assert counts == dict(
                forward_bytes_sent=buffer,
                forward_bytes_received=buffer,
                backward_bytes_sent=2 * buffer,
                backward_bytes_received=2 * buffer,
            )


def test_packed_documents_under_zigzag_are_refused_in_one_line():
    from dattn_cli.kernels import REGISTRY

    module = REGISTRY["RingDilatedAttention"].cls([8], [1], layout="zigzag")
    x = torch.zeros(1, 8, 2, 4)
    with pytest.raises(ValueError, match=r"packed documents \(cu_seqlens\) are not supported with layout='zigzag'"):
        module._distributed(x, x, x, False, None, torch.tensor([0, 3, 16]), False, 0, 2)


def test_bad_layout_is_refused_in_one_line():
    from dattn_cli.kernels import REGISTRY

    with pytest.raises(ValueError, match=r"^layout='stripes' is unknown: use one of contiguous, zigzag, documents$"):
        REGISTRY["DistributedImprovedDilatedAttention"].cls([8], [1], layout="stripes")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_block_sparse_ring_zigzag_equals_the_reference(world):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention, block_sparse_reference

    per_rank = run_distributed(zw.block_sparse_zigzag_cases, world, timeout_s=300)
    for case in per_rank[0]:
        c, i = case
        options, n = zw.BS_CASES[c]
        causal, _ = zw.BS_VARIANTS[i]
        q, k, v, up, mask = zw.bs_inputs(c, i)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        table = BlockSparseRingDilatedAttention(block_size=8, **options).block_table(n, 4)
        kr, vr = (x.repeat_interleave(2, dim=2) for x in (k, v))
        ref, ref_lse = block_sparse_reference(q, kr, vr, table, 8, causal, key_padding_mask=mask)
        ref_grads = torch.autograd.grad(ref, (q, k, v), up)
        where = (world, case)
        assert rel_err(_joined(per_rank, "out", case, n), ref) <= 1e-5, where
        assert rel_err(_joined(per_rank, "lse", case, n), ref_lse) <= 1e-5, where
        for j in range(3):
            assert rel_err(_joined(per_rank, "grads", case, n, j), ref_grads[j]) <= 1e-4, (where, j)
        for rank, r in enumerate(per_rank):
            comm = {key: value for key, value in r[case]["comm"].items() if key != "forward_calls"}
            assert comm == r[case]["expected"], (where, rank)


def test_block_sparse_sliding_window_under_zigzag_is_refused_in_one_line():
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    with pytest.raises(ValueError, match=r"not supported with layout='zigzag': use layout='contiguous'"):
        BlockSparseRingDilatedAttention(pattern="sliding_window", block_size=8, layout="zigzag")


@pytest.mark.slow
def test_rotary_multihead_takes_positions_from_the_layout():
    errors = run_distributed(zw.rotary_multihead_error, 4, "RingMultiheadDilatedAttention", timeout_s=120)
    assert max(errors) < 1e-5, errors
