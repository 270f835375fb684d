"""The zigzag shard rule (kernels/distributed/layout.py) without processes: which positions each rank holds,
the padded length under zigzag, and the exact round trip of rank_shard / join_shards for any N and p."""

import random

import pytest
import torch

from dattn_cli.kernels import padded_length
from dattn_cli.kernels.distributed.layout import rank_chunks, rank_positions, sequence_order
from dattn_cli.kernels.distributed.sharding import join_shards, rank_shard


def test_rank_a_holds_chunks_a_and_2p_minus_1_minus_a():
    assert [rank_chunks(r, 4, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert rank_positions(1, 2, 6, "zigzag").tolist() == [3, 4, 5, 6, 7, 8]
    assert rank_positions(1, 2, 6, "contiguous").tolist() == [6, 7, 8, 9, 10, 11]
    held = torch.cat([rank_positions(r, 3, 4, "zigzag") for r in range(3)])
    assert torch.equal(held[sequence_order(3, 4, "zigzag")], torch.arange(12))


def test_zigzag_padded_length_aligns_chunks_and_whole_groups():
    assert padded_length(13, 4, layout="zigzag") == 16  # chunks of 2: N' = 2p·ceil(N/2p)
    assert padded_length(16, 4, layout="zigzag") == 16
    assert padded_length(50, 3, block_size=8, layout="zigzag") == 96  # C multiple of 8
    # C = 1024 would let ŵ = 3072 span 3 of 4 chunks (a ragged group): C = 1536, two groups of 2 chunks
    assert padded_length(4096, 2, [3072], layout="zigzag") == 4 * 1536
    assert padded_length(4096, 4, [1024, 4096], layout="zigzag") == 4096


def _aligned(chunk, chunks, segments, block):
    total = chunk * chunks
    spans = [min(w, total) for w in segments]
    return chunk % block == 0 and all(chunk % s == 0 or (s % chunk == 0 and total % s == 0) for s in spans)


def test_zigzag_padded_length_is_the_smallest_aligned_one():
    rng = random.Random(1)
    for _ in range(300):
        n, world = rng.randint(1, 90), rng.randint(2, 5)
        segments = rng.sample(range(1, 25), rng.randint(0, 3))
        block = rng.choice([None, 1, 4])
        chunk = -(-n // (2 * world))
        while not _aligned(chunk, 2 * world, segments, block or 1):
            chunk += 1
        assert padded_length(n, world, segments, block, "zigzag") == 2 * world * chunk, (n, world, segments, block)


@pytest.mark.parametrize("n,world", [(16, 2), (13, 4), (50, 3), (7, 4), (64, 8)])
def test_round_trip_is_exact_and_masks_the_padding(n, world):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, n, 3, generator=g)
    user = torch.rand(2, n, generator=g) < 0.3
    length = padded_length(n, world, layout="zigzag") // world
    shards = [rank_shard(x, r, world, length, layout="zigzag") for r in range(world)]
    masked = [rank_shard(x, r, world, length, layout="zigzag", key_padding_mask=user)[1] for r in range(world)]
    assert torch.equal(join_shards([s for s, _ in shards], n, layout="zigzag"), x)
    assert torch.equal(join_shards(masked, n, layout="zigzag"), user)
    for r, (shard, mask) in enumerate(shards):
        positions = rank_positions(r, world, length, "zigzag")
        real = positions < n
        assert torch.equal(shard[:, real], x[:, positions[real]]) and not shard[:, ~real].any()
        assert mask is None if world * length == n else torch.equal(mask[0], ~real)


def test_bad_layout_is_one_line():
    with pytest.raises(ValueError, match=r"^layout='striped' is unknown: use one of contiguous, zigzag$"):
        rank_shard(torch.zeros(1, 4), 0, 2, 2, layout="striped")
