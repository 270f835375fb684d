"""Hybrid h x ring attention on gloo ranks (2x2 on 4 ranks, 2x4 and 4x2 on 8): equals the dense float64
reference, forward, lse and gradients (causal and not, dilation, GQA/MQA, key masks, contiguous and zigzag
shards), and each rank's bytes equal hybrid_comm_volume."""

import pytest
import torch

from dattn_cli.kernels import dilated_attention_reference
from dattn_cli.kernels.distributed.hybrid import check_sizes, hybrid_comm_volume, zigzag_order
from dattn_cli.kernels.distributed.sharding import join_shards
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import hybrid_workers as hw


def _joined(per_rank, key, case, layout, index=None):
    shards = [r[case][key] if index is None else r[case][key][index] for r in per_rank]
    return join_shards(shards, hw.N, layout=layout)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "h"), [(4, 2), (8, 2), (8, 4)], ids=["2x2", "2x4", "4x2"])
def test_hybrid_equals_the_reference_and_bytes_equal_the_formula(world, h):
    per_rank = run_distributed(hw.hybrid_cases, world, h, timeout_s=300)
    for layout in hw.LAYOUTS:
        for c, (H, KV, segs, rates, sem, causal, masked) in enumerate(hw.CASES):
            case, where = (layout, c), (f"{h}x{world // h}", layout, c)
            q, k, v, up, mask = hw.inputs(c)
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            ref, ref_lse = dilated_attention_reference(q, k, v, segs, rates, causal, sem, key_padding_mask=mask)
            ref_grads = torch.autograd.grad(ref, (q, k, v), up)
            assert rel_err(_joined(per_rank, "out", case, layout), ref) <= 1e-5, where
            assert rel_err(_joined(per_rank, "lse", case, layout), ref_lse) <= 1e-5, where
            for j in range(3):
                assert rel_err(_joined(per_rank, "grads", case, layout, j), ref_grads[j]) <= 1e-4, (where, j)
            expected = hybrid_comm_volume(
                hw.N, world, h, hw.B, H, hw.D, 4, segs, rates, sem, causal, masked, KV, layout, with_lse=True
            )
            for rank, r in enumerate(per_rank):
                comm = {key: value for key, value in r[case]["comm"].items() if key != "forward_calls"}
                assert comm == expected[rank], (where, rank)
    assert max(r["multihead"] for r in per_rank) < 1e-5


def test_hybrid_refuses_in_one_line():
    messages = run_distributed(hw.refusals, 2, timeout_s=60)[0]
    assert messages[0] == (
        "HybridDilatedAttention needs head_group= and ring_group=: make them with "
        "hybrid_groups(group, head_parallel_size)"
    )
    assert messages[1].startswith("3 heads cannot be split over head_parallel_size=2")
    with pytest.raises(ValueError, match=r"head_parallel_size=3 must divide the 8 ranks of the hybrid"):
        check_sizes(8, 3)


def test_zigzag_rows_come_in_ring_order():
    # h = 2, shards of 4 rows: rank 0 holds chunks (a, 2p-1-a) = rows 0-1 and 2-3, rank 1 rows 4-5 and 6-7; the
    # ring wants the early chunks (rows 0-1, 4-5), then the late ones in sequence order (rank 1's, then rank 0's)
    assert zigzag_order(2, 4).tolist() == [0, 1, 4, 5, 6, 7, 2, 3]


def test_hybrid_volume_by_hand():
    # 2x2, N = 64 (L = 16), B = 1, H = 2, D = 8, fp32, one pair (64, 1): the all-to-alls move 4 tensors of
    # 16·2·8·4 bytes, half of each; the ring of 2 members at 1 head moves one buffer of 32 rows each way
    a2a = 4 * 16 * 2 * 8 * 4 // 2
    buffer = 2 * 32 * 8 * 4
    for counts in hybrid_comm_volume(64, 4, 2, 1, 2, 8, 4, [64], [1]):
        assert counts == dict(
            forward_bytes_sent=a2a + buffer,
            forward_bytes_received=a2a + buffer,
            backward_bytes_sent=a2a + 2 * buffer,
            backward_bytes_received=a2a + 2 * buffer,
        )
