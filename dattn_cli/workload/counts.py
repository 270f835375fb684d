"""The one formula set for FLOPs and communication bytes: bench rows, the planner and the docs use these.

FLOPs (the convention every report states): forward = 4·D·P, with P the (query, key) pairs actually
computed, summed over batch, heads and dilation pairs, causal counted exactly (each registry entry's
`pairs` hook); fwd+bwd = 3.5 x forward. Layers add their matmuls: 2·T·(4E² + 2EF) per block and
2·T·E·V for a model's head, x3 with backward.

Communication (docs/communication.md): the span rule and the byte rule are the kernels'
(kernels/distributed/shards.py: shard_plan, pair_traffic; exchange.packed_elements), evaluated here with
S = 2·B·H_i·D·e·⌈L/r⌉ for every member (H_i: the K/V heads of a kept row, SpanningPair.kv_heads; L = shard_of:
⌈N/p⌉, or more where shards must align with the segments or blocks, kernels/distributed/sharding.py): ring
non-causal (g-1)·S forward, 3·(g-1)·S fwd+bwd (rotation twice, dK/dV home); causal, the last rank of a group
(g-1)·S forward, 2·(g-1)·S fwd+bwd; all-gather (g-1)·S forward, 2·(g-1)·S fwd+bwd. Head-parallel: two all-to-alls of
q, k, v, out forward (and of their gradients backward), each moving (p-1)/p of a rank's shard; with GQA k and v
at lcm(H_kv, p) heads.
"""

from __future__ import annotations

import math

from ..kernels.distributed.exchange import packed_elements
from ..kernels.distributed.shards import pair_traffic, shard_plan
from ..kernels.registry import shard_length
from .architecture import block_matmul_parameters
from .problem import ELEMENT_BYTES, Problem

FWD_BWD_FACTOR = 3.5
LINEAR_FWD_BWD_FACTOR = 3.0


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
    """FLOPs of the linear layers of a layer/model problem: 2·T per weight of the block's matrix multiplications
    (architecture.block_matmul_parameters: q E·H·D, k and v E·K, o H·D·E, the MLP 2EF or gated 3EF; LongNetLM's
    2E² + 2E·K + 2EF), 2·T·E·V for a model's head, x3 with backward (the recomputed forward of checkpointing not
    counted: useful work only)."""
    if p.target == "attention":
        return 0.0
    tokens, width = p.batch * p.seq_len, p.width
    linear = 2.0 * tokens * block_matmul_parameters(p) * p.layers
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
    """(g, r, H_i) for each pair whose segment spans g > 1 ranks of the padded sequence: the kernels' shard plan
    (rank 0's), H_i the K/V heads one kept row carries over its head sets (at the kv heads with GQA)."""
    world = p.world_size
    _, spanning = shard_plan(
        shard_of(p) * world,
        world,
        0,
        p.heads,
        p.segment_lengths,
        p.dilation_rates,
        p.semantics,
        p.impl,
        p.heads // p.kv_head_count,
    )
    return [(plan.ranks_per_segment, plan.rate, plan.kv_heads) for plan in spanning]


def packed_kv_bytes(p: Problem, heads: int, rate: int) -> int:
    """S: one rank's packed kept K/V rows of one pair, 2·B·H_i·D·e·⌈L/r⌉ (exchange.packed_elements)."""
    return packed_elements(p.batch, heads, p.head_dim, -(-shard_of(p) // rate)) * ELEMENT_BYTES[p.dtype]


def sequence_parallel_traffic(p: Problem) -> tuple[int, int, float]:
    """(bytes received by the busiest rank, messages on its critical path, remote share of its compute)
    for the ring and all-gather strategies: the kernels' byte rule (shards.pair_traffic) for the last member
    of each group, every member packing S; exact when r divides L (comm_volume counts each member's rows)."""
    fwdbwd = p.mode == "fwdbwd"
    total, messages, remote = 0, 0, 0.0
    for g, r, heads in spanning_pairs(p):
        sizes = [packed_kv_bytes(p, heads, r)] * g
        _, forward, _, backward = pair_traffic(p.strategy, sizes, sizes, g - 1, p.causal)
        total += forward + (backward if fwdbwd else 0)
        messages += (g - 1) * ((3 if p.strategy == "ring" else 2) if fwdbwd else 1)
        remote += (g - 1) / g
    return total, messages, min(1.0, remote / max(1, len(p.segment_lengths)))


def head_parallel_traffic(p: Problem) -> tuple[int, int]:
    """(bytes, messages) of one rank's all-to-alls: q and out at H heads, k and v at lcm(H_kv, p) (GQA)."""
    world = p.world_size
    per_head = p.batch * shard_of(p) * p.head_dim * ELEMENT_BYTES[p.dtype]
    heads = 2 * p.heads + 2 * math.lcm(p.kv_head_count, world)
    calls = 2 if p.mode == "fwdbwd" else 1
    return heads * per_head * (world - 1) // world * calls, 4 * calls * (world - 1)
