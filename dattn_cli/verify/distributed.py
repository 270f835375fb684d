"""Verification of distributed implementations: each rank computes its shard, the caller compares
the concatenation with the reference on the whole sequence (references.ReferenceCache: the same one the
single-process checks of the case use).

Any N over any p: each rank takes its shard of the sequence padded at the end, the padding masked
(kernels/distributed/sharding.py), and the padding is cut off the concatenation. Core modules: out, lse and
dq/dk/dv shards are concatenated. Multihead modules (same weights on every
rank, as under DDP): out and dx shards are concatenated, and the ranks' parameter gradients are summed
(what DDP's all-reduce would do) before the comparison. Every check has its own seed, so a rank and the
caller draw the same inputs and weights.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..kernels.distributed.sharding import join_shards, rank_shard
from ..kernels.registry import REGISTRY, shard_call_options, shard_length
from ..runtime.attach import backend as attach_backend
from ..runtime.launch import run_distributed
from ..runtime.measure import reuse_freed_memory
from ..workload.build import build_module
from ..workload.problem import Problem
from .compare import DTYPES, errors_against
from .outputs import CORE_KEYS, core_outputs, multihead_outputs
from .references import ReferenceCache, case_seed, draw_inputs, multihead_module
from .report import CaseResult, case_result
from .variants import Variant


def rank_outputs(rank: int, world: int, jobs: list[tuple[dict, int]]) -> list[dict]:
    """Runs on every rank: for each (problem, seed), this rank's shards and its comm_stats(). The sequence is
    padded at the end to the shard length the implementation needs (registry.shard_length), the padding
    masked; `seq_len` in each result tells `combine` where the real sequence ends."""
    reuse_freed_memory()  # as the verify command does: freed chunks stay in the heap for the next ones
    results = []
    for data, seed in jobs:
        p = _on_rank_device(Problem.model_validate(data), rank)
        length = shard_length(p, world)
        inputs, upstream = draw_inputs(p, seed)
        shards = [rank_shard(x, rank, world, length, layout=p.layout)[0] for x in inputs]
        upstream, mask = rank_shard(upstream, rank, world, length, layout=p.layout)
        options = shard_call_options(p, mask, length * world)
        if p.spec.kind == "multihead":
            module = multihead_module(p, seed)
            result = multihead_outputs(module, shards[0], upstream, p.causal, **options)
        else:
            module = build_module(p)
            xs = [x.clone().requires_grad_() for x in shards]
            result = core_outputs(lambda q, k, v: module.forward_with_lse(q, k, v, p.causal, **options), xs, upstream)
        result = {k: v.cpu() for k, v in result.items()}  # CUDA tensors do not travel between processes as values
        results.append({**result, "comm": module.comm_stats(), "seq_len": p.seq_len, "layout": p.layout})
    return results


def _on_rank_device(p: Problem, rank: int) -> Problem:
    """On CUDA each rank works on its own GPU: LOCAL_RANK's under a launcher, else the rank's (spawned here)."""
    if not p.device.startswith("cuda"):
        return p
    local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    return p.model_copy(update={"device": f"cuda:{local}"})


def combine(multihead: bool, per_rank: list[list[dict]], job: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The whole-sequence result of job `job` from the ranks' shards, the padding cut off, on `device` (the
    reference's)."""
    seq_len, layout = per_rank[0][job]["seq_len"], per_rank[0][job].get("layout", "contiguous")
    keys = ("out", "dx") if multihead else CORE_KEYS
    got = {k: join_shards([r[job][k] for r in per_rank], seq_len, layout=layout).to(device) for k in keys}
    if multihead:
        got["dparams"] = torch.stack([r[job]["dparams"] for r in per_rank]).sum(0).to(device)
    return got


def verify_group(
    impl: str, world: int, checks: list[Variant], cache: ReferenceCache, timeout_s: float, attached: Any = None
) -> list[CaseResult]:
    """One process group of `world` ranks runs `checks`, the checks of `impl`: spawned here (gloo on CPU,
    "cpu:gloo,cuda:nccl" on CUDA, a GPU per rank), or the launcher's world when `attached`
    (runtime.attach.World; every rank gets every rank's shards). Each is judged against its case's reference
    from `cache`."""
    if not checks:
        return []
    jobs = [(v.problem.model_dump(), case_seed(v.case, cache.seed)) for v in checks]
    try:
        if attached is None:
            backend = attach_backend() if checks[0].problem.device.startswith("cuda") else "gloo"
            per_rank = run_distributed(rank_outputs, world, jobs, backend=backend, timeout_s=timeout_s)
        else:
            per_rank = _attached_outputs(attached, impl, jobs, timeout_s)
    except Exception as exc:  # the whole group failed: every check of it is a failure, reported
        return [case_result(v, failure=str(exc)) for v in checks]
    multihead = REGISTRY[impl].kind == "multihead"
    results = []
    for j, v in enumerate(checks):
        comm = [r[j]["comm"] for r in per_rank]
        try:
            reference = cache.get(v.case, v.problem)
        except Exception as exc:
            results.append(case_result(v, failure=f"reference: {type(exc).__name__}: {exc}", comm=comm))
            continue
        got = combine(multihead, per_rank, j, v.problem.device)
        results.append(case_result(v, errors_against(got, reference, DTYPES[v.problem.dtype]), comm=comm))
    return results


def _attached_outputs(world: Any, impl: str, jobs: list[tuple[dict, int]], timeout_s: float) -> list[list[dict]]:
    """rank_outputs on this rank of the launcher's world, and every other rank's through the store; a rank that
    failed or fell silent is a DistributedError naming it (the cause, not a peer that only lost it)."""
    from ..runtime.attach import RankSilent, exchange, post_failure
    from ..runtime.heartbeat import measuring
    from ..runtime.launch import DistributedError, peer_symptom

    try:
        with measuring(f"verify {impl}, {len(jobs)} check(s)"):
            mine: Any = rank_outputs(world.rank, world.world_size, jobs)
    except Exception as exc:
        mine = f"rank {world.rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        post_failure(world.rank, mine)
    results = exchange(f"verify/{impl}/{jobs[0][1]}", mine, world, timeout_s)
    failures = [r.message if isinstance(r, RankSilent) else r for r in results if isinstance(r, (str, RankSilent))]
    if failures:
        cause = next((f for f in failures if not peer_symptom(f)), failures[0])
        raise DistributedError(cause)
    return results
