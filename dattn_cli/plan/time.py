"""Time of one attention call per device on a hardware profile (the planner's time model).

* compute   = FLOPs / (peak[dtype] x efficiency); FLOPs by workload/counts.py (4·D·P forward, P = attended
              pairs this device computes; fwd+bwd = 3.5 x). Efficiency: where the profile has a curve for
              the kernel (plan/efficiency.py), the dense kernel's efficiency at each block the implementation
              runs (its length and its count in flight), FLOP-weighted; else the profile's prior per
              implementation (`per_impl`, fitted by `plan --calibrate`, or `attention_compute`)
* memory    = with curves only: the gathers (where a kernel cannot take strided rows) and the merge of the dilated
              implementations' blocks (on a GPU the one-pass combine, kernels/combine.py) at memory bandwidth x
              efficiency.memory_bandwidth (engine_traffic: a model of the extra passes, not measured)
* comm      = Σ messages (latency + bytes / (bandwidth x efficiency)); the link is intra-node while the
              group fits in `devices_per_node`, else inter-node; bytes from workload/counts.py
* ring overlap: each ring step's transfer hides under the previous step's compute when
              step compute time >= step transfer time; total = compute + memory + max(0, comm - overlappable)
"""

from __future__ import annotations

from pydantic import BaseModel

from ..kernels.pattern import build_blocks
from ..workload.counts import (
    FWD_BWD_FACTOR,
    flops_per_device,
    head_parallel_traffic,
    sequence_parallel_traffic,
    shard_of,
)
from ..workload.problem import ELEMENT_BYTES, Problem
from .efficiency import KERNELS, curve_efficiency, curve_source, has_curve
from .memory import combined_call
from .profiles import HardwareProfile

# Extra memory passes per block, in units of the block's q-sized tensor b·segments·rows·heads·D·e (a model):
# forward: q, k, v gathered and out scattered back (read + write each) when r > 1; the LSE merge reads the
# block's out and reads/writes the accumulator when a call has more than one block. Backward: q, k, v, dout, out
# gathered (r > 1), dq, dk, dv read and accumulated (read + write) whenever gradients of several blocks add up.
GATHER_PASSES = {"fwd": 8, "fwdbwd": 8 + 10}
MERGE_PASSES = {"fwd": 3, "fwdbwd": 3 + 9}


class TimeBreakdown(BaseModel):
    flops: float
    compute_s: float
    comm_bytes: int = 0  # no communication by default: one device
    messages: int = 0
    comm_s: float = 0.0
    overlappable_s: float = 0.0
    comm_hidden: bool = True
    total_s: float
    link: str
    note: str
    kernel: str | None = None  # the dense kernel whose curve gave the efficiency (None: the profile's prior)
    efficiency: float | None = None  # achieved / peak FLOP/s of the compute, FLOP-weighted over the blocks
    efficiency_source: str = ""
    memory_bytes: int = 0  # gather/merge traffic
    memory_s: float = 0.0


def estimate_time(s: Problem, profile: HardwareProfile) -> TimeBreakdown:
    peak = profile.required_peak(s.dtype)
    flops = flops_per_device(s)
    kernel, efficiency, source, traffic = compute_efficiency(s, profile)
    compute = flops / (peak * efficiency)
    memory_s = profile.memory_seconds(traffic)
    p = s.world_size
    comm_bytes, messages, overlappable, note = 0, 0, 0.0, "single device: no communication"
    if p > 1 and s.strategy in ("ring", "allgather"):
        comm_bytes, messages, steps_share = sequence_parallel_traffic(s)
        # the remote blocks' compute is what a ring transfer can hide under
        overlappable = compute * steps_share if s.strategy == "ring" else 0.0
        note = (
            "ring: per step, transfer vs compute of the previous block"
            if s.strategy == "ring"
            else "all-gather: a collective before the remote blocks, not overlapped"
        )
    elif p > 1 and s.strategy == "head_parallel":
        comm_bytes, messages = head_parallel_traffic(s)
        note = "head-parallel: all-to-alls before and after attention, not overlapped"
    comm = profile.transfer_seconds(p, messages, comm_bytes)
    hidden = comm <= overlappable if messages else True
    total = compute + memory_s + max(0.0, comm - overlappable)
    return TimeBreakdown(
        flops=flops,
        compute_s=compute,
        comm_bytes=comm_bytes,
        messages=messages,
        comm_s=comm,
        overlappable_s=overlappable,
        comm_hidden=hidden,
        total_s=total,
        link=profile.link(p)[0],
        note=note,
        kernel=kernel,
        efficiency=efficiency,
        efficiency_source=source,
        memory_bytes=traffic,
        memory_s=memory_s,
    )


def kernel_for(s: Problem, profile: HardwareProfile) -> str:
    """The dense kernel that computes `s`'s blocks: a named backend (plan --kernel), the dense baseline itself, flex
    for block-sparse patterns, else what kernels/backends.resolve_backend picks for `auto` with flash-attn
    installed (flash for fp16/bf16 on a GPU, math for float64 on a GPU, sdpa otherwise)."""
    if s.backend in KERNELS:
        return s.backend
    if s.spec.strategy in ("dense", "reference"):
        return s.impl if s.impl in KERNELS else "math"
    if s.spec.block_sparse:
        return "flex"
    if profile.kind == "gpu" and s.dtype in ("float16", "bfloat16"):
        return "flash"
    return "math" if profile.kind == "gpu" and s.dtype == "float64" else "sdpa"


def kernel_blocks(s: Problem) -> list[tuple[int, int, int, int, int]]:
    """(rows n, problems in flight, FLOP weight, rate, q-sized elements) of each dense call one device makes:
    the whole N for dense kernels; for block-sparse ones the keys each query row attends to on average (a
    query tile's inner loop runs over its kept key blocks only), with the shard's rows as the problems in flight;
    for dilated implementations the blocks of kernels/pattern.py on the device's rows (its shard, segments cut at
    the shard: a ring step is one (L/r) x (L/r) block; head-parallel: H/p heads over all N)."""
    if s.spec.strategy in ("dense", "reference"):
        return [(s.seq_len, s.batch * s.heads, 1, 1, s.batch * s.heads * s.seq_len)]
    if s.spec.block_sparse:
        rows = s.batch * s.heads * shard_of(s)
        keys = max(
            1, round(flops_per_device(s) / (4 * s.head_dim * (FWD_BWD_FACTOR if s.mode == "fwdbwd" else 1)) / rows)
        )
        return [(keys, s.batch * s.heads * max(1, shard_of(s) // keys), 1, 1, rows)]
    heads, length = _local_shape(s)
    segments = [min(w, length) for w in s.segment_lengths]
    out = []
    for b in build_blocks(length, heads, segments, s.dilation_rates, s.semantics):
        in_flight = s.batch * b.num_segments * b.num_heads
        out.append((b.rows, in_flight, b.pairs_attended(s.batch, s.causal), b.rate, in_flight * b.rows))
    return out


def _local_shape(s: Problem) -> tuple[int, int]:
    """(heads, positions) one device's dilated blocks cover: its shard, or its head shard of all N."""
    if s.world_size > 1 and s.strategy == "head_parallel":
        return max(1, s.heads // s.world_size), s.seq_len
    return s.heads, (shard_of(s) if s.world_size > 1 else s.seq_len)


def engine_traffic(s: Problem, profile: HardwareProfile, blocks: list) -> int:
    """Bytes the dilated engine moves besides its kernels (a model, per call): gathers of r > 1 blocks where the
    kernel cannot take their strided views (on a CPU; on a GPU when a row is not a multiple of 16 bytes), and the
    merge: on a GPU the one-pass combine (kernels/combine.py) reads every block's result once and writes the
    output once, in forward and for each of dq, dk, dv; elsewhere MERGE_PASSES per block (fp32 accumulators)."""
    gpu = profile.kind == "gpu"
    element = ELEMENT_BYTES[s.dtype] * s.head_dim
    views = gpu and element % 16 == 0
    traffic = 0 if views else sum(GATHER_PASSES[s.mode] * q * element for _, _, _, r, q in blocks if r > 1)
    if len(blocks) <= 1:
        return traffic
    if gpu and combined_call(s, "cuda", len(blocks)):
        heads, length = _local_shape(s)
        results = sum(q for *_, q in blocks) + s.batch * heads * length
        return traffic + (4 if s.mode == "fwdbwd" else 1) * results * element
    return traffic + sum(MERGE_PASSES[s.mode] * q * element for *_, q in blocks)


def compute_efficiency(s: Problem, profile: HardwareProfile) -> tuple[str | None, float, str, int]:
    """(kernel or None, efficiency, its source, gather/merge bytes) of one call of `s` on `profile`."""
    eff = profile.efficiency
    kernel = kernel_for(s, profile)
    if not has_curve(eff, kernel, s.dtype, s.causal, s.mode):
        prior = eff.compute_for(s.impl, s.mode)
        fitted = s.impl in eff.per_impl or f"{s.impl}/{s.mode}" in eff.per_impl
        return None, prior, ("per_impl (plan --calibrate)" if fitted else "attention_compute prior"), 0
    blocks = kernel_blocks(s)
    weights = sum(w for _, _, w, _, _ in blocks) or 1
    inverse = sum(
        w / curve_efficiency(eff, kernel, s.dtype, s.head_dim, s.causal, s.mode, n, k, profile.ridge(s.dtype))
        for n, k, w, _, _ in blocks
        if w
    )
    efficiency = weights / inverse if inverse else 1.0
    traffic = engine_traffic(s, profile, blocks)
    return kernel, efficiency, curve_source(eff, kernel, s.dtype, s.head_dim, s.causal, s.mode), traffic
