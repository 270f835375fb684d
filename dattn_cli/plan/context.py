"""Dense context parallelism (plan --sequence-parallel C with a dense --impl, `--sp-kind`): the attention of a
named model's block split over C devices the way the kind says, computed by the dense kernel the --impl names.

Each kind is dattn's own distributed core of that kind over one segment of N (dilation 1), which is dense
attention: ring (RingDilatedAttention: K/V passed round the ring, a step's transfer under its block's compute,
Ring Attention / context parallelism as Megatron and torchtitan run it), allgather
(DistributedImprovedDilatedAttention: K/V all-gathered, as Llama 3's context parallelism), head_parallel
(HeadParallelDilatedAttention: all-to-all to H/C heads over all N, DeepSpeed-Ulysses) and hybrid
(HybridDilatedAttention: head groups x a ring, USP). Their memory and time are those kinds' models
(plan/memory.py, plan/time.py), their blocks at the dense kernel's efficiency curve (the --impl's, or --kernel).

Memory: ring, allgather and hybrid as dattn's cores hold it (the ring's K/V in flight, fp32 accumulators and block
results are of the same size as ring-flash-attn's). head_parallel is the dense kernel itself on the head shard
between two all-to-alls (DeepSpeed's DistributedAttention, ALST's UlyssesSPAttentionHF: `_SeqAllToAll` saves
nothing), not dattn's blocked engine. With x the bytes of the local q (= the head shard's: N x H/C heads) and
k_h those of a head shard's k (N x max(H_kv/C, 1) heads: kv heads are replicated when fewer than C):
* kept until the backward: the kernel's inputs and output on the head shard, 2x + 2k_h, its lse, and the
  output's local copy (o_proj's input), x; the local q, k, v are consumed by the all-to-all;
* the backward: the upstream gradient x, its head-shard copy x, the head shard's dq, dk, dv x + 2k_h, and the
  kernel's fp32 dq accumulator (plan/memory.py, FLASH_BACKWARD_DQ_ACCUMULATOR x x on a GPU in half precision).
"""

from __future__ import annotations

from typing import Literal

from ..workload.problem import ELEMENT_BYTES, Problem
from .efficiency import KERNELS
from .memory import FLASH_BACKWARD_DQ_ACCUMULATOR, estimate_memory

SpKind = Literal["ring", "allgather", "head_parallel", "hybrid"]
# The share of a single call's kernel rate a dense attention reaches when a ring or an all-gather splits it: each
# step (or gathered chunk) is a call of its own, cut in two for the causal load balance, its (out, lse) merged in
# fp32, every step waiting on its neighbours. Fitted (python benchmarks/plan_published.py --fit) on one published
# run, nemo-ls-llama2-7b-h100-256k (NeMo's long-sequence table: Llama 2 7B on 256 H100s, TP 4 x CP 8, N = 256K),
# and checked on the others (benchmarks/RESULTS.md). head_parallel runs one whole call per head shard: 1. A causal
# ring (or all-gather) on contiguous shards is also imbalanced: rank r computes r + 1/2 of the r blocks' L x L
# work, the last C - 1/2 where the mean is C/2, and every step (or the next layer) waits on it: its attention
# takes (2C - 1) / C of the balanced time; zigzag shards (--layout zigzag) balance it.
CP_ATTENTION_EFFICIENCY = 0.59
STEPPED = ("ring", "allgather", "hybrid")  # the kinds whose attention is a call per ring step or gathered chunk
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


def split_kind(call: Problem) -> str | None:
    """The kind of a dense attention split over its world (dense_context's call), else None."""
    dense = call.segment_lengths == [call.seq_len] and call.dilation_rates == [1] and call.world_size > 1
    kind = call.sp_kind
    return kind if dense and kind is not None and call.impl == KIND_IMPLS[kind] else None


def split_rate(call: Problem) -> float:
    """The share of its kernel's rate a dense attention reaches split by `call`'s kind: CP_ATTENTION_EFFICIENCY for
    the ring, all-gather and hybrid kinds, whose calls are per step or chunk, over their causal imbalance on
    contiguous shards (module docstring); 1 otherwise."""
    kind = split_kind(call)
    if kind not in STEPPED:
        return 1.0
    from ..kernels.registry import hybrid_size

    ring = call.world_size // (hybrid_size(call, call.world_size) if kind == "hybrid" else 1)
    imbalance = (2 * ring - 1) / ring if call.causal and call.layout == "contiguous" else 1.0
    return CP_ATTENTION_EFFICIENCY / imbalance


def attention_items(call: Problem, device_type: str) -> dict[str, int]:
    """The memory items of a block's attention call: plan/memory.py's, or a dense attention's split by head
    parallelism or by the hybrid (module docstring)."""
    kind = split_kind(call)
    if kind == "hybrid":
        return _hybrid_items(call, device_type)
    if kind != "head_parallel":
        return estimate_memory(call, 0, device_type).items
    e, c = ELEMENT_BYTES[call.dtype], call.world_size
    x = call.batch * call.seq_len * (call.heads // c) * call.head_dim * e
    k_h = call.batch * call.seq_len * max(call.kv_head_count // c, 1) * call.head_dim * e
    items = {
        "inputs q, k, v": 0,
        "output": x,
        "lse": call.batch * call.seq_len * (call.heads // c) * 4,
        "head-shard q, k, v, out": 2 * x + 2 * k_h,
    }
    if call.mode == "fwdbwd":
        items["gradients (upstream, dq, dk, dv)"] = 2 * x + 2 * k_h
        items["all-to-all copies"] = x
        half = device_type == "cuda" and call.dtype in ("float16", "bfloat16")
        items["kernel workspace"] = int(FLASH_BACKWARD_DQ_ACCUMULATOR * x) if half else 0
    return items


def _hybrid_items(call: Problem, device_type: str) -> dict[str, int]:
    """USP (module docstring): an all-to-all over h head ranks, then the ring's items on the head shard (H/h heads,
    N·h/C positions) over C/h ranks, the output's local copy after the all-to-all back, and in the backward the
    upstream gradient's head-shard copy."""
    from ..kernels.registry import hybrid_size

    h = hybrid_size(call, call.world_size)
    ring = call.model_copy(
        update={
            "impl": KIND_IMPLS["ring"],
            "sp_kind": "ring",
            "world_size": call.world_size // h,
            "heads": call.heads // h,
            "kv_heads": max(call.kv_head_count // h, 1),
            "head_parallel_size": None,
        }
    )
    items = estimate_memory(ring, 0, device_type).items
    x = call.batch * -(-call.seq_len // call.world_size) * call.heads * call.head_dim * ELEMENT_BYTES[call.dtype]
    items["output"] = items.get("output", 0) + x
    if call.mode == "fwdbwd":
        items["all-to-all copies"] = x
    return items
