"""Verification of distributed implementations: each rank computes its shard, the caller compares
the concatenation with the single-process reference on the whole sequence.

Core modules: out, lse and dq/dk/dv shards are concatenated. Multihead modules (same weights on every
rank, as under DDP): out and dx shards are concatenated, and the ranks' parameter gradients are summed
(what DDP's all-reduce would do) before the comparison.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import REGISTRY
from ..kernels.distributed.sequence_parallel import SequenceParallelBase, shard_plan
from .build import build_core, build_multihead
from .cases import VERIFY_BLOCK_SIZE, VerifyCase

CORE_KEYS = ("out", "lse", "dq", "dk", "dv")
MULTIHEAD_KEYS = ("out", "dx", "dparams")


def shard_problem(case: VerifyCase, world: int, impl: str) -> str | None:
    """Why `case` cannot be split over `world` ranks for `impl`, or None when it can."""
    if case.seq_len % world:
        return f"N={case.seq_len} is not divisible by {world} ranks"
    entry = REGISTRY[impl]
    if impl == "HeadParallelDilatedAttention" and case.heads % world:
        return f"{case.heads} heads are not divisible by {world} ranks"
    core = entry.cls.attention_class if entry.kind == "multihead" else entry.cls
    if entry.block_sparse and (case.seq_len // world) % VERIFY_BLOCK_SIZE and world > 1:
        return f"N/p = {case.seq_len // world} is not a multiple of the block size {VERIFY_BLOCK_SIZE}"
    if issubclass(core, SequenceParallelBase) and world > 1:
        try:
            shard_plan(case.seq_len, world, 0, case.heads, case.segment_lengths, case.dilation_rates, "longnet", impl)
        except ValueError as exc:
            return str(exc)
    return None


def case_inputs(case: VerifyCase, seed: int) -> list[torch.Tensor]:
    """q, k, v and the upstream gradient of the whole sequence, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.seq_len, case.heads, case.head_dim)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4)]


def multihead_inputs(case: VerifyCase, seed: int) -> list[torch.Tensor]:
    """x and the upstream gradient (batch, N, embed) of the whole sequence."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.seq_len, case.heads * case.head_dim)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2)]


def run_multihead(module: nn.Module, x: torch.Tensor, upstream: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_()
    out, _ = module(x, x, x, is_causal=causal)
    params = list(module.parameters())
    grads = torch.autograd.grad(out, [x, *params], upstream.to(out.dtype))
    return {"out": out.detach(), "dx": grads[0], "dparams": torch.cat([g.flatten().double() for g in grads[1:]])}


def rank_outputs(rank: int, world: int, impl: str, jobs: list[tuple], dtype_name: str) -> list[dict]:
    """Runs on every rank: for each (case, semantics, causal, backend, seed, pattern), this rank's shards."""
    dtype = getattr(torch, dtype_name)
    multihead = REGISTRY[impl].kind == "multihead"
    results = []
    for case_data, semantics, causal, backend, seed, pattern in jobs:
        case = VerifyCase.model_validate(case_data)
        length = case.seq_len // world
        shard = slice(rank * length, (rank + 1) * length)
        if multihead:
            x, upstream = multihead_inputs(case, seed)
            module = build_multihead(impl, case, semantics, backend, seed, pattern).to(dtype)
            result = run_multihead(module, x[:, shard].to(dtype), upstream[:, shard], causal)
        else:
            q, k, v, upstream = case_inputs(case, seed)
            xs = [x[:, shard].to(dtype).clone().requires_grad_() for x in (q, k, v)]
            module = build_core(impl, case, semantics, backend, pattern)
            out, lse = module.forward_with_lse(*xs, causal)
            grads = torch.autograd.grad(out, xs, upstream[:, shard].to(dtype))
            result = {"out": out.detach(), "lse": lse.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        results.append({**result, "comm": module.comm_stats()})
    return results


def combine(impl: str, per_rank: list[list[dict]], job: int) -> dict[str, torch.Tensor]:
    """The whole-sequence result of job `job` from the ranks' shards."""
    if REGISTRY[impl].kind == "multihead":
        got = {k: torch.cat([r[job][k] for r in per_rank], dim=1) for k in ("out", "dx")}
        got["dparams"] = torch.stack([r[job]["dparams"] for r in per_rank]).sum(0)
        return got
    return {k: torch.cat([r[job][k] for r in per_rank], dim=1) for k in CORE_KEYS}
