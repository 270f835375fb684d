"""The engine: the gather of r > 1 blocks (strided views where the kernel takes them, copies where it needs
(or, on CPU flash, prefers) them; DATTN_BLOCK_LAYOUT forces either, and both give the same result), and its
dropout streams (one function of (seed, rank, set, member) for every module)."""

import pytest
import torch

from dattn_cli.kernels import ImprovedDilatedAttention
from dattn_cli.kernels.backends import BACKENDS, BlockCall
from dattn_cli.kernels.engine import BlockAttention, ViewAccess, dropout_stream


def _run(backend, dtype, causal):
    torch.manual_seed(0)
    xs = [torch.randn(2, 96, 4, 16, dtype=dtype).requires_grad_() for _ in range(3)]
    module = ImprovedDilatedAttention([16, 32, 48], [1, 2, 3], backend=backend)
    out = module(*xs, is_causal=causal)
    grads = torch.autograd.grad(out, xs, torch.randn_like(out))
    return out, *grads


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_views_and_copies_of_dilated_blocks_give_the_same_result(monkeypatch, backend, dtype, causal):
    layouts = []
    target = BACKENDS[backend]
    forward, backward = target.forward, target.backward

    def spy_forward(q, k, v, key_pad, call):
        layouts.append(q.is_contiguous())
        return forward(q, k, v, key_pad, call)

    def spy_backward(dout, q, *rest):
        layouts.append(q.is_contiguous())
        return backward(dout, q, *rest)

    monkeypatch.setattr(target, "forward", spy_forward)
    monkeypatch.setattr(target, "backward", spy_backward)
    seen = {}
    results = {}
    for layout in ("view", "copy"):
        monkeypatch.setenv("DATTN_BLOCK_LAYOUT", layout)
        layouts.clear()
        results[layout] = _run(backend, dtype, causal)
        seen[layout] = list(layouts)
    # r > 1 blocks reached the kernel as strided views in one run and as contiguous copies in the other
    assert not all(seen["view"]) and seen["view"] != seen["copy"]
    assert sum(seen["copy"]) > sum(seen["view"])
    # equal up to the BLAS's summation order: MKL takes another kernel for a strided operand on some CPUs
    # (AMD EPYC: float64 results 4 ulp apart; Intel Xeon: bitwise equal)
    tol = 16 * torch.finfo(dtype).eps
    for a, b in zip(results["view"], results["copy"]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend, kernel", [("math", "math"), ("sdpa", "cpu-flash"), ("auto", "cpu-flash")])
def test_the_kernels_a_call_ran_on_are_recorded(backend, kernel):
    from dattn_cli.kernels.block_kernels import kernels_used, reset_kernels_used

    reset_kernels_used()
    _run(backend, torch.float32, causal=False)
    assert kernels_used() == kernel
    reset_kernels_used()
    assert kernels_used() is None


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
