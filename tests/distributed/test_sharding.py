"""shard_sequence / gather_sequence and the padded length: the smallest aligned N' = p·L, each rank's padded
shard and the mask of its padding, the round trip over gloo ranks, and one clear line for bad input."""

import itertools
import random

import pytest
import torch

from dattn_cli.kernels import gather_sequence, padded_length, shard_sequence
from dattn_cli.kernels.distributed.sharding import join_shards, rank_shard
from dattn_cli.runtime.launch import DistributedError, run_distributed
from tests.distributed import sharding_workers as sw


def _aligned(length, world, segments, block):
    spans = [min(w, world * length) for w in segments]
    return length % block == 0 and all(length % s == 0 or s % length == 0 for s in spans)


def test_padded_length_is_the_smallest_aligned_one():
    rng = random.Random(0)
    for _ in range(400):
        n, world = rng.randint(1, 90), rng.randint(2, 5)
        segments = rng.sample(range(1, 25), rng.randint(0, 3))
        block = rng.choice([None, 1, 4, 8])
        naive = next(
            length for length in itertools.count(-(-n // world)) if _aligned(length, world, segments, block or 1)
        )
        assert padded_length(n, world, segments, block) == world * naive, (n, world, segments, block)


def test_padded_length_examples():
    assert padded_length(50, 3, [8, 20]) == 120  # L must be a multiple of 8 and of 20
    assert padded_length(50, 4, [8, 20]) == 160
    assert padded_length(96, 3, [16, 64, 96]) == 96  # already aligned: no padding
    assert padded_length(24, 3, [8, 64]) == 24  # w > N: ŵ = N' = 24 is a multiple of L = 8
    assert padded_length(50, 3, block_size=8) == 72
    assert padded_length(50, 3) == 51
    assert padded_length(7, 1, [3], 4) == 7  # one rank takes any N
    # large coprime segments: candidates, not a count up to their product (which is the answer here)
    assert padded_length(10**6, 4, [999_983, 999_979]) == 4 * 999_983 * 999_979


def test_rank_shard_pads_the_end_and_masks_it():
    x = torch.arange(2 * 10, dtype=torch.float32).view(2, 10, 1).requires_grad_()
    user = torch.zeros(2, 10, dtype=torch.bool)
    user[1, 3] = True
    shards = [rank_shard(x, r, 3, 4, key_padding_mask=user) for r in range(3)]
    assert [s.shape[1] for s, _ in shards] == [4, 4, 4]
    assert torch.equal(shards[2][0][:, 2:], torch.zeros(2, 2, 1))  # positions 10, 11 are padding
    mask = torch.cat([m for _, m in shards], dim=1)
    expected = torch.cat([user, torch.ones(2, 2, dtype=torch.bool)], dim=1)
    assert torch.equal(mask, expected)
    assert torch.equal(join_shards([s for s, _ in shards], 10), x)
    join_shards([s for s, _ in shards], 10).sum().backward()  # differentiable in x
    assert torch.equal(x.grad, torch.ones_like(x))
    # nothing padded and no mask: None on every rank; padded: a mask on every rank, even one without padding
    assert rank_shard(torch.zeros(1, 9, 2), 0, 3, 3)[1] is None
    assert rank_shard(torch.zeros(1, 10, 2), 0, 3, 4)[1].any().item() is False


def test_one_process_shards_nothing():
    x = torch.randn(2, 7, 3)
    shard, mask = shard_sequence(x, segment_lengths=[4], block_size=2)
    assert torch.equal(shard, x) and mask is None
    assert torch.equal(gather_sequence(shard, 7), x)


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: shard_sequence(torch.zeros(5)), "x has shape (5,): pass a tensor (batch, seq_len, ...)"),
        (lambda: shard_sequence(torch.zeros(2, 5), dim=2), "dim=2 is not a dimension of x with shape (2, 5)"),
        (lambda: shard_sequence(torch.zeros(2, 5), dim=0), "dim=0 is the batch dimension"),
        (
            lambda: shard_sequence(torch.zeros(2, 5), segment_lengths=[4, 0]),
            "segment_lengths must be a positive integer",
        ),
        (lambda: shard_sequence(torch.zeros(2, 5), block_size=2.5), "block_size must be a positive integer, got 2.5"),
        (
            lambda: shard_sequence(torch.zeros(2, 5), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
            "key_padding_mask must be a bool tensor of shape (2, 5)",
        ),
        (lambda: gather_sequence(torch.zeros(2, 5), 6), "seq_len=6 is not within the 5 positions"),
        (lambda: gather_sequence(torch.zeros(2, 5), 0), "seq_len must be a positive integer, got 0"),
        (lambda: padded_length(10, 0), "world must be a positive integer, got 0"),
        (lambda: rank_shard(torch.zeros(1, 10), 0, 3, 3), "length=3: 3 shards of 3 hold fewer than the N=10"),
    ],
)
def test_bad_input_is_one_line_naming_the_parameter(call, needle):
    with pytest.raises(ValueError) as info:
        call()
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("world", [3, 4])
def test_round_trip_over_ranks(world):
    per_rank = run_distributed(sw.round_trip, world, timeout_s=60)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 50, 3, generator=g)
    user = torch.rand(2, 50, generator=g) < 0.5
    padded = padded_length(50, world, sw.SEGMENTS)
    assert {r["shard"].shape[1] for r in per_rank} == {padded // world}
    for r in per_rank:  # every rank gets the whole sequence back, padding cut off
        assert torch.equal(r["back"], x) and torch.equal(r["back_dim2"], x.transpose(1, 2)) and r["same"]
    positions = torch.arange(padded)
    assert torch.equal(torch.cat([r["mask"] for r in per_rank], 1), (positions >= 50).expand(2, padded))
    with_user = torch.cat([user, torch.ones(2, padded - 50, dtype=torch.bool)], 1)
    assert torch.equal(torch.cat([r["user_mask"] for r in per_rank], 1), with_user)


def test_gather_of_different_shard_shapes_fails_with_the_reason():
    with pytest.raises(DistributedError, match="gather_sequence: ranks disagree on shard shape"):
        run_distributed(sw.gather_mismatched, 2, timeout_s=30)
