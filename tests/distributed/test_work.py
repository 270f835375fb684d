"""kernels/distributed/work.py: per-position pair counts sum to the registry's pair counts (the FLOP convention's
P), head shards add up, and the documents layout's rank_pairs is the dense causal case."""

from __future__ import annotations

import pytest
import torch

from dattn_cli.kernels.distributed.document_layout import rank_pairs
from dattn_cli.kernels.distributed.layout import rank_positions
from dattn_cli.kernels.distributed.work import (
    block_pairs_per_position,
    document_pairs_per_position,
    pairs_per_position,
    rank_work,
)
from dattn_cli.kernels.documents import offsets
from dattn_cli.workload import Problem


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("n, segments, rates", [(64, [16, 32, 64], [1, 2, 4]), (50, [8, 20], [1, 3]), (30, [64], [1])])
def test_sum_is_the_registry_pair_count(n, segments, rates, semantics, causal):
    p = Problem(seq_len=n, heads=6, segment_lengths=segments, dilation_rates=rates, semantics=semantics, causal=causal)
    counted = pairs_per_position(n, segments, rates, 6, semantics, causal)
    assert int(counted.sum()) == p.spec.pairs(p)


@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
def test_head_shards_add_up(semantics):
    whole = pairs_per_position(96, [24, 48], [2, 3], 8, semantics, True)
    shards = [pairs_per_position(96, [24, 48], [2, 3], 8, semantics, True, (j * 2, j * 2 + 2)) for j in range(4)]
    assert torch.equal(sum(shards), whole)


@pytest.mark.parametrize("causal", [False, True])
def test_block_pairs_are_the_block_pattern_count(causal):
    p = Problem(
        impl="BlockSparseRingDilatedAttention", seq_len=256, heads=4, segment_lengths=[64, 128, 256],
        dilation_rates=[1, 2, 4], block_size=16, causal=causal,
    )  # fmt: skip
    table = p.block_pattern().table(256, 4)
    assert int(block_pairs_per_position(table, 16, 4, causal).sum()) == p.spec.pairs(p)


def test_dense_causal_balance_p4():
    """The zigzag benchmark's figures: dense causal p = 4, contiguous rank a holds a·L² + L(L+1)/2 pairs (max/mean
    -> 1.75), zigzag every rank the same (1.00)."""
    n, world = 8192, 4
    shard = n // world
    per = pairs_per_position(n, [n], [1], 1)
    work = {
        layout: rank_work(per, torch.stack([rank_positions(r, world, shard, layout) for r in range(world)]))
        for layout in ("contiguous", "zigzag")
    }
    assert work["contiguous"].tolist() == [a * shard * shard + shard * (shard + 1) // 2 for a in range(world)]
    assert (work["contiguous"].max() / work["contiguous"].double().mean()).item() == pytest.approx(1.75, abs=1e-3)
    assert len(set(work["zigzag"].tolist())) == 1


def test_rank_pairs_is_dense_causal_per_document():
    docs = [5, 1, 10]
    positions = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
    expected = torch.tensor([1 + 2 + 3 + 4, 5 + 1 + 1 + 2, 3 + 4 + 5 + 6, 7 + 8 + 9 + 10])
    assert torch.equal(rank_pairs(positions, offsets(docs)), expected)
    dense = document_pairs_per_position(docs, None, None, 1)
    assert torch.equal(rank_work(dense, torch.tensor([[0, -1, 99]])), torch.tensor([1]))
