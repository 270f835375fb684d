"""Block-sparse ring form on gloo: the concatenated shards equal the block-masked reference (forward,
lse, gradients), each rank receives exactly the key blocks its queries use, and the bytes it moves
equal `comm_volume`."""

import pytest
import torch

from dattn_cli.kernels import BlockSparseRingDilatedAttention, block_sparse_reference
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import workers


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ring_shards_equal_the_reference_and_move_only_used_blocks(world):
    per_rank = run_distributed(workers.block_sparse_cases, world, timeout_s=120)
    assert len(per_rank[0]) >= 4 * len(workers.BS_VARIANTS)
    for c, i in per_rank[0]:
        options, n = workers.BS_CASES[c]
        causal, masked = workers.BS_VARIANTS[i]
        q, k, v, up, mask = workers.bs_inputs(c, i)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        table = BlockSparseRingDilatedAttention(block_size=8, **options).block_table(n, 3)
        ref, ref_lse = block_sparse_reference(q, k, v, table, 8, causal, key_padding_mask=mask)
        ref_grads = torch.autograd.grad(ref, (q, k, v), up)
        where = (world, options["pattern"], causal, masked)
        assert rel_err(torch.cat([r[c, i]["out"] for r in per_rank], 1), ref) <= 1e-5, where
        assert rel_err(torch.cat([r[c, i]["lse"] for r in per_rank], 1), ref_lse) <= 1e-5, where
        for j in range(3):
            assert rel_err(torch.cat([r[c, i]["grads"][j] for r in per_rank], 1), ref_grads[j]) <= 1e-4, (where, j)
        per_rank_blocks = n // world // 8
        allowed = table.tril() if causal else table
        for rank, r in enumerate(per_rank):
            mine = range(rank * per_rank_blocks, (rank + 1) * per_rank_blocks)
            used = set(allowed[list(mine)].any(0).nonzero().flatten().tolist()) - set(mine)
            received = {b for blocks in r[c, i]["received"].values() for b in blocks}
            assert received == used, (where, rank)
            comm = {key: value for key, value in r[c, i]["comm"].items() if key != "forward_calls"}
            assert comm == r[c, i]["expected"], (where, rank)


@pytest.mark.slow
def test_local_window_moves_one_neighbour_block_each_way():
    """Hand count: N=64, p=4, block 8 (2 blocks per rank), window 1: an inner rank receives one block from
    each neighbour: 2 blocks x 8 rows x (K and V: 2 x H=3 x D=8) x batch 2 x 4 bytes = 6,144 B."""
    per_rank = run_distributed(workers.block_sparse_cases, 4, timeout_s=120)
    inner = per_rank[1][0, 0]
    assert inner["received"] == {0: [1], 2: [4]}
    assert inner["comm"]["forward_bytes_received"] == 2 * 8 * 2 * 3 * 8 * 2 * 4 == 6144
    assert per_rank[0][0, 0]["received"] == {1: [2]}


def test_shard_not_a_multiple_of_the_block_size_is_refused():
    from dattn_cli.runtime.launch import DistributedError

    with pytest.raises(DistributedError, match="not a multiple of block_size=8"):
        run_distributed(workers.block_sparse_bad_shard, 2, timeout_s=60)
