"""Functions run on every rank by run_distributed (module level, so rank processes can import them)."""

import torch

from dattn_cli.kernels import HeadParallelDilatedAttention

SHAPE = dict(B=2, N=64, H=8, D=8)
CASES = [(sem, causal, segs, rates)
         for sem in ("longnet", "head_groups") for causal in (False, True)
         for segs, rates in (([8, 16], [1, 2]), ([16, 64], [1, 4]), ([12, 64], [2, 3]))]


def full_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, N, H, D = SHAPE.values()
    return [torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(4)]


def head_parallel_cases(rank: int, world: int):
    """Per case: this rank's output and gradient shards, and its comm byte counts."""
    results = []
    for i, (sem, causal, segs, rates) in enumerate(CASES):
        q, k, v, upstream = full_inputs(i)
        length = SHAPE["N"] // world
        shard = slice(rank * length, (rank + 1) * length)
        xs = [x[:, shard].float().clone().requires_grad_() for x in (q, k, v)]
        module = HeadParallelDilatedAttention(segs, rates, semantics=sem)
        out = module(*xs, is_causal=causal)
        out.backward(upstream[:, shard].float())
        results.append({"out": out.detach(), "grads": [x.grad for x in xs], "comm": module.comm_stats()})
    return results


def fail_on_rank_one(rank: int, world: int):
    if rank == 1:
        raise RuntimeError("deliberate failure on this rank")
    torch.distributed.barrier()  # the healthy ranks wait in a collective that can never complete
    return rank


def mismatched_shapes(rank: int, world: int):
    length = 16 if rank == 0 else 24
    q = torch.randn(1, length, 4, 8)
    HeadParallelDilatedAttention([8], [1])(q, q, q)
    return rank
