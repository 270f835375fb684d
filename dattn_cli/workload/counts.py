"""The one formula set for FLOPs and communication bytes: bench rows, the planner and the docs use these.

FLOPs (the convention every report states): forward = 4·D·P, with P the (query, key) pairs actually
computed, summed over batch, heads and dilation pairs, causal counted exactly (each registry entry's
`pairs` hook); fwd+bwd = 3.5 x forward. Layers add their matmuls: 2·T·(4E² + 2EF) per block and
2·T·E·V for a model's head, x3 with backward.

Communication (docs/communication.md): per spanning pair (a segment over g > 1 ranks) with
S = 2·B·H_i·D·e·⌈L/r⌉ (H_i: the K/V heads of a kept row, travelling_kv_heads), the packed kept K/V rows of one rank (L = shard_of: ⌈N/p⌉, or more where shards must
align with the segments or blocks; the sequence is padded to N' = p·L, kernels/distributed/sharding.py): ring non-causal (g-1)·S forward,
3·(g-1)·S fwd+bwd (rotation twice, dK/dV home); causal, the last rank of a group (g-1)·S forward,
2·(g-1)·S fwd+bwd; all-gather (g-1)·S forward, 2·(g-1)·S fwd+bwd. Head-parallel: two all-to-alls of
q, k, v, out forward (and of their gradients backward), each moving (p-1)/p of a rank's shard; with GQA k and v
at lcm(H_kv, p) heads.
"""

from __future__ import annotations

import math

from ..kernels.heads import KVHeadSet
from ..kernels.pattern import head_sets
from ..kernels.registry import shard_length
from .problem import ELEMENT_BYTES, Problem

FWD_BWD_FACTOR = 3.5
LINEAR_FWD_BWD_FACTOR = 3.0
FLOP_CONVENTION = (
    "fwd FLOPs = 4*D*P, P = attended (query, key) pairs summed over batch, heads and dilation pairs "
    "(causal counted exactly); fwd+bwd = 3.5 x fwd"
)


def attended_pairs(p: Problem) -> int:
    """P of the whole problem (all ranks) for one attention call."""
    attention = p.attention_problem() if p.target != "attention" else p
    return sum(doc.spec.pairs(doc) for doc in attention.document_problems())  # packed documents: each on its own


def attention_flops(p: Problem) -> float:
    """FLOPs of one attention call over all ranks (fwd, or fwd+bwd)."""
    return 4.0 * p.head_dim * attended_pairs(p) * (FWD_BWD_FACTOR if p.mode == "fwdbwd" else 1.0)


def flops_per_device(p: Problem) -> float:
    return 4.0 * p.head_dim * (attended_pairs(p) // p.world_size) * (FWD_BWD_FACTOR if p.mode == "fwdbwd" else 1.0)


def linear_flops(p: Problem) -> float:
    """FLOPs of the linear layers of a layer/model problem: 2·T·(2E² + 2E·E_kv + 2EF) per block (E_kv = E without
    GQA), 2·T·E·V for a model's
    head, x3 with backward (the recomputed forward of checkpointing not counted: useful work only)."""
    if p.target == "attention":
        return 0.0
    tokens, width, kv = p.batch * p.seq_len, p.width, p.kv_head_count * p.head_dim  # GQA: k, v project to E_kv
    linear = 2.0 * tokens * (2 * width * width + 2 * width * kv + 2 * width * p.hidden) * p.layers
    if p.target == "model":
        linear += 2.0 * tokens * width * p.vocab_size
    return linear * (LINEAR_FWD_BWD_FACTOR if p.mode == "fwdbwd" else 1.0)


def total_flops(p: Problem) -> float:
    """Useful FLOPs of one measured call: the attention (in every block), plus the linear layers."""
    return p.layers * attention_flops(p) + linear_flops(p) if p.target != "attention" else attention_flops(p)


def shard_of(p: Problem) -> int:
    """L, the positions one of p.world_size ranks holds (the whole N on one device): registry.shard_length."""
    return shard_length(p, p.world_size) if p.world_size > 1 and p.spec.distributed else p.seq_len


def spanning_pairs(p: Problem) -> list[tuple[int, int, int]]:
    """(g, r, H_i) for each pair whose segment spans g > 1 ranks of the padded sequence."""
    shard = shard_of(p)
    padded = shard * p.world_size
    pairs = []
    for i, (w, r) in enumerate(zip(p.segment_lengths, p.dilation_rates)):
        span = min(w, padded)
        if shard % span == 0:
            continue
        if span % shard:
            raise ValueError(
                f"segment length {span} neither divides nor is a multiple of N/p = {shard}: "
                "use segment lengths that are divisors or multiples of N/p"
            )
        pairs.append((span // shard, r, travelling_kv_heads(p, i, r)))
    return pairs


def travelling_kv_heads(p: Problem, pair: int, rate: int) -> int:
    """H_i: the K/V heads one kept row of pair i carries, summed over its head sets: the heads using the pair,
    or with GQA the distinct kv heads behind each set (kernels/heads.py; H_kv·r/H of them when r divides H/H_kv)."""
    sets = head_sets(pair, rate, p.heads, len(p.segment_lengths), p.semantics)
    group = p.heads // p.kv_head_count
    return sum(KVHeadSet(h0, step, count, group).kv_count for _, h0, step, count in sets)


def packed_kv_bytes(p: Problem, heads: int, rate: int) -> int:
    """S: one rank's packed kept K/V rows of one pair, 2·B·H_i·D·e·⌈L/r⌉."""
    shard = shard_of(p)
    return 2 * p.batch * heads * p.head_dim * ELEMENT_BYTES[p.dtype] * -(-shard // rate)


def sequence_parallel_traffic(p: Problem) -> tuple[int, int, float]:
    """(bytes received by the busiest rank, messages on its critical path, remote share of its compute)
    for the ring and all-gather strategies; exact when r divides L (kernels' comm_volume)."""
    fwdbwd = p.mode == "fwdbwd"
    total, messages, remote = 0, 0, 0.0
    for g, r, heads in spanning_pairs(p):
        if p.strategy == "ring":
            passes = (2 if p.causal else 3) if fwdbwd else 1
            messages += (g - 1) * (3 if fwdbwd else 1)
        else:
            passes = 2 if fwdbwd else 1
            messages += (g - 1) * passes
        total += passes * (g - 1) * packed_kv_bytes(p, heads, r)
        remote += (g - 1) / g
    return total, messages, min(1.0, remote / max(1, len(p.segment_lengths)))


def head_parallel_traffic(p: Problem) -> tuple[int, int]:
    """(bytes, messages) of one rank's all-to-alls: q and out at H heads, k and v at lcm(H_kv, p) (GQA)."""
    world = p.world_size
    per_head = p.batch * shard_of(p) * p.head_dim * ELEMENT_BYTES[p.dtype]
    heads = 2 * p.heads + 2 * math.lcm(p.kv_head_count, world)
    calls = 2 if p.mode == "fwdbwd" else 1
    return heads * per_head * (world - 1) // world * calls, 4 * calls * (world - 1)
