"""The engine's dropout streams: one function of (seed, rank, set, member) for every module."""

import pytest
import torch

from dattn_cli.kernels.backends import BACKENDS, BlockCall
from dattn_cli.kernels.engine import BlockAttention, ViewAccess, dropout_stream

SETS = (0, 1, 63, 64, 65, 99, 100, 101, 1000, 2047)
MEMBERS = (*range(70), 99, 100, 101, 128, 1023, 1024, 1025, 2047)


@pytest.mark.parametrize("seed", [0, 12345, (1 << 64) - 3])  # the last wraps around
def test_no_two_streams_collide_at_1024_ranks(seed):
    streams = [dropout_stream(seed, rank, s, m) for rank in range(1024) for s in SETS for m in MEMBERS]
    assert all(0 <= x < 1 << 64 for x in streams)
    # distinct, also in the low 32 bits: all of the seed torch's CPU generator uses
    assert len({x % (1 << 32) for x in streams}) == len(streams) == 1024 * len(SETS) * len(MEMBERS)


def test_the_old_offsets_collided_where_the_stream_does_not():
    # the former 100*set + member (dilated ring) and (block*64 + source)*2 (block-sparse) offsets
    assert 100 * 1 + 0 == 100 * 0 + 100
    assert (0 * 64 + 64) * 2 == (1 * 64 + 0) * 2
    assert dropout_stream(7, 0, 1, 0) != dropout_stream(7, 0, 0, 100)
    assert dropout_stream(7, 0, 0, 64) != dropout_stream(7, 0, 1, 0)


def test_the_engine_draws_each_rank_its_own_stream():
    call = BlockCall(False, 1.0, dropout_p=0.5, seed=99)
    seeds = {BlockAttention([], ViewAccess(None), "math", call, rank=r)._call(3, 1).seed for r in range(8)}
    assert seeds == {dropout_stream(99, r, 3, 1) for r in range(8)} and len(seeds) == 8
    quiet = BlockAttention([], ViewAccess(None), "math", BlockCall(False, 1.0, seed=99), rank=5)
    assert quiet._call(3, 1).seed == 99  # no dropout: the seed is not used, nor checked


def test_dropout_masks_differ_between_ranks_and_repeat_on_one():
    q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
    call = BlockCall(False, 0.5, dropout_p=0.5, seed=1)

    def out(rank):
        engine = BlockAttention([], ViewAccess(None), "math", call, rank=rank)
        return BACKENDS["math"].forward(q, k, v, None, engine._call(0))[0]

    assert torch.equal(out(0), out(0))
    assert not torch.equal(out(0), out(1))
