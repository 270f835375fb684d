"""Verification of distributed implementations: each rank computes its shard, the caller compares
the concatenation with the single-process reference on the whole sequence."""

from __future__ import annotations

import torch

from ..kernels import REGISTRY
from .cases import VerifyCase


def shardable(case: VerifyCase, world: int, impl: str) -> bool:
    if case.seq_len % world:
        return False
    return not (impl == "HeadParallelDilatedAttention" and case.heads % world)


def case_inputs(case: VerifyCase, seed: int) -> list[torch.Tensor]:
    """q, k, v and the upstream gradient of the whole sequence, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.seq_len, case.heads, case.head_dim)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4)]


def rank_outputs(rank: int, world: int, impl: str, jobs: list[tuple], dtype_name: str) -> list[dict]:
    """Runs on every rank: for each (case, semantics, causal, backend, seed), this rank's shards."""
    dtype = getattr(torch, dtype_name)
    results = []
    for case_data, semantics, causal, backend, seed in jobs:
        case = VerifyCase.model_validate(case_data)
        q, k, v, upstream = case_inputs(case, seed)
        length = case.seq_len // world
        shard = slice(rank * length, (rank + 1) * length)
        xs = [x[:, shard].to(dtype).clone().requires_grad_() for x in (q, k, v)]
        module = REGISTRY[impl].cls(case.segment_lengths, case.dilation_rates, semantics=semantics, backend=backend)
        out, lse = module.forward_with_lse(*xs, causal)
        grads = torch.autograd.grad(out, xs, upstream[:, shard].to(dtype))
        results.append({"out": out.detach(), "lse": lse.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2],
                        "comm": module.comm_stats()})
    return results
