"""Dense context parallelism (plan --sequence-parallel C with a dense --impl, `--sp-kind`): the attention of a
named model's block split over C devices the way the kind says, computed by the dense kernel the --impl names.

Each kind is dattn's own distributed core of that kind over one segment of N (dilation 1), which is dense
attention: ring (RingDilatedAttention: K/V passed round the ring, a step's transfer under its block's compute,
Ring Attention / context parallelism as Megatron and torchtitan run it), allgather
(DistributedImprovedDilatedAttention: K/V all-gathered, as Llama 3's context parallelism), head_parallel
(HeadParallelDilatedAttention: all-to-all to H/C heads over all N, DeepSpeed-Ulysses) and hybrid
(HybridDilatedAttention: head groups x a ring, USP). Their memory and time are those kinds' models
(plan/memory.py, plan/time.py), their blocks at the dense kernel's efficiency curve (the --impl's, or --kernel).
"""

from __future__ import annotations

from typing import Literal

from ..workload.problem import Problem
from .efficiency import KERNELS

SpKind = Literal["ring", "allgather", "head_parallel", "hybrid"]
KIND_IMPLS = {
    "ring": "RingDilatedAttention",
    "allgather": "DistributedImprovedDilatedAttention",
    "head_parallel": "HeadParallelDilatedAttention",
    "hybrid": "HybridDilatedAttention",
}
MULTIHEAD_IMPLS = {  # dattn's own LongNet block: its multihead attention of the kind
    "ring": "RingMultiheadDilatedAttention",
    "allgather": "DistributedImprovedMultiheadDilatedAttention",
    "head_parallel": "HeadParallelMultiheadDilatedAttention",
    "hybrid": "HybridMultiheadDilatedAttention",
}


def dense_context(attention: Problem, kind: str | None) -> Problem:
    """The attention call of a dense --impl split by `kind` (default ring): the kind's core over one segment of N,
    its blocks computed by the dense kernel."""
    backend = attention.backend if attention.backend != "auto" else attention.impl
    return attention.model_copy(
        update={
            "impl": KIND_IMPLS[kind or "ring"],
            "segment_lengths": [attention.seq_len],
            "dilation_rates": [1],
            "backend": backend if backend in KERNELS else "auto",
        }
    )


def check(s: Problem, sequence_parallel: int) -> None:
    """--sp-kind names how a dense attention is split; a distributed --impl is its own kind (bad input: one line)."""
    kind = s.sp_kind
    if kind is None:
        return
    if s.target != "model":
        raise ValueError(f"--sp-kind {kind} splits a model's attention: plan it with --target model (or --model)")
    if sequence_parallel == 1:
        raise ValueError(f"--sp-kind {kind} splits the sequence over --sequence-parallel C > 1 devices: give C")
    if s.spec.distributed and s.spec.strategy != kind:
        raise ValueError(
            f"--impl {s.impl} is a {s.spec.strategy} implementation: drop --sp-kind {kind}, or give --impl "
            f"{MULTIHEAD_IMPLS[kind] if s.spec.kind == 'multihead' else KIND_IMPLS[kind]}"
        )
