"""Peak memory per device, itemised, from what the implementations allocate.

Derived from the engine (kernels/engine.py) over the block plan of the configuration, not fitted to a
curve: the tensors alive at the peak are counted one by one. `tests/plan/test_memory.py` checks the
tensor items against `measure.LiveTensorBytes` (every storage torch allocates, counted while alive);
`dattn plan --check` compares the total with measured bench rows.

Items (bytes, per device):
* inputs        q, k, v (this device's shard; k, v at the kv heads), and with GQA k, v repeated to H heads while
                the call runs (kernels/heads.py) and, in backward, the kv-head dk, dv they are summed into
* output        the result, and for half inputs the fp32 accumulator it is converted from
* lse           float32 (B, L, H)
* gather        kept-row copies of the dilated blocks (r > 1), held by the memory pool: 3 per block
                shape in forward, 5 (q, k, v, dout, out) in backward
* block result  the largest non-adopted block's (out, lse) in forward; its (dq, dk, dv) in backward
* gradients     upstream gradient, dq, dk, dv accumulators (fwd+bwd)
* comm buffers  sequence parallel: the packed sparsified K/V in flight (ring: the held and the
                prefetched buffer; all-gather: all g members' rows, kept for backward, and the dK/dV
                shares); head-parallel: the all-to-all send/receive copies
* workspace     memory the attention kernel takes outside torch's view (contiguous copies of strided
                inputs, per-thread scratch): a stated multiple of the largest block, per backend
* framework     the runtime's fixed cost (CUDA context, allocator reserve; CPU: thread pools,
                first-call code) from the hardware profile, and allocator rounding per tensor
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from pydantic import BaseModel

from ..kernels import chunks, combine
from ..kernels.backends import accumulator_dtype
from ..kernels.chunks import chunk_length
from ..kernels.distributed.shards import shard_plan
from ..kernels.pattern import Block, build_blocks, pair_blocks
from ..workload.counts import packed_kv_bytes, shard_of, spanning_pairs
from ..workload.problem import ELEMENT_BYTES, Problem
from .profiles import HardwareProfile

# Kernel workspace and allocator slack, in units of the largest block's q-sized tensor (b·h·m·D
# elements): memory the process holds beyond the live tensors (fused-kernel scratch invisible to torch's
# dispatcher, malloc arenas). Measured on this project's CPU host (torch 2.13, glibc) as
# (peak RSS - framework - live tensor bytes) / block size over N = 4K..64K (docs/plan.md): the blocked
# engine ("dilated") holds about half a block more in forward, the dense kernel nothing. On CUDA the
# caching allocator's view is exact up to rounding, and the fused kernels' scratch is O(b·h·m).
WORKSPACE = {("dilated", "cpu", "fwd"): 0.5, ("dilated", "cpu", "fwdbwd"): 1.4}  # (kind, device, mode); else 0


# FlashAttention-2's backward (flash-attn, and aten's copy of it that the sdpa blocks use for fp16/bf16 on CUDA)
# accumulates dq in an fp32 buffer of the block's q shape (flash_api.cpp mha_bwd: dq_accum), twice the
# half-precision q: measured on an H200, sdpa fwd+bwd at 16k tokens x hidden 2048 peaks at exactly eight
# q-sized tensors plus this buffer (benchmarks/gpu/h200_run2/standard_shape.jsonl).
FLASH_BACKWARD_DQ_ACCUMULATOR = 2.0


class MemoryBreakdown(BaseModel):
    items: dict[str, int]
    total: int


@dataclass
class _Tally:
    items: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, nbytes: float) -> None:
        self.items[name] = self.items.get(name, 0) + int(nbytes)


def _local_blocks(s: Problem, length: int, heads: int) -> list[Block]:
    """The blocks one device computes locally (its shard, or its head shard of the whole sequence)."""
    if s.strategy in ("ring", "allgather"):  # the kernels' shard plan, rank 0's
        world = s.world_size
        return shard_plan(length * world, world, 0, heads, s.segment_lengths, s.dilation_rates, s.semantics, s.impl)[0]
    if heads != s.heads:
        blocks = []
        for i, (w, r) in enumerate(zip(s.segment_lengths, s.dilation_rates)):
            blocks += pair_blocks(i, length, heads, w, r, len(s.segment_lengths), s.semantics, 0, s.heads)
        return blocks
    return build_blocks(length, heads, s.segment_lengths, s.dilation_rates, s.semantics)


def _block_elems(batch: int, block: Block, head_dim: int) -> int:
    return batch * block.num_segments * block.num_heads * block.rows * head_dim


def _covers_all(block: Block, length: int, heads: int) -> bool:
    """The block is the whole call: rate 1 from position 0, every head, all `length` positions."""
    shape = (block.rate, block.start, block.head_step, block.num_heads, block.num_segments * block.seg_len)
    return shape == (1, 0, 1, heads, length)


def estimate_memory(
    s: Problem, framework_bytes: int = 0, device_type: str = "cpu", chunked: bool = True
) -> MemoryBreakdown:
    """Peak bytes on one device for one call of `s` (fwd, or fwd+bwd), itemised. A single-device dilated call
    long enough to run in sequence chunks (kernels/chunks.py) is its full-size tensors plus one chunk's working
    set (chunked=False: as one call)."""
    e = ELEMENT_BYTES[s.dtype]
    length = shard_of(s) if s.strategy in ("ring", "allgather", "head_parallel") else s.seq_len
    t = _Tally()
    x_shard = s.batch * length * s.heads * s.head_dim * e  # one (B, L, H, D) tensor
    t.items.update(_input_items(s, x_shard), output=x_shard)
    model = s.spec.memory_model
    if model is None:
        raise ValueError(f"the planner has no memory model for {s.impl} ({s.spec.strategy}): plan another --impl")
    if model == "reference":
        return _finish(t, framework_bytes, reference_items(s))
    if model in ("dense", "dense_scores"):
        _dense_items(t, s, x_shard, device_type)
        return _finish(t, framework_bytes)
    chunk = _sequence_chunk(s) if chunked else None
    if s.documents is not None:  # one engine call per document: the longest one's working set (kernels/documents.py)
        chunk = min(chunk or s.seq_len, max(s.documents))
    if chunk is not None:
        return _finish(t, framework_bytes, _chunked_items(s, chunk, x_shard, device_type))
    _dilated_items(t, s, length, x_shard, device_type)
    return _finish(t, framework_bytes)


def _sequence_chunk(s: Problem) -> int | None:
    """Positions per chunk of a single-device dilated call, as the module chooses them (None: one call)."""
    if s.strategy != "single":
        return None
    return chunk_length(s.batch, s.seq_len, s.heads, s.head_dim, s.segment_lengths, chunks.SEQUENCE_CHUNK_ELEMENTS)


def _chunked_items(s: Problem, chunk: int, x_shard: int, device_type: str) -> dict[str, int]:
    """q, k, v, out, lse (and dout, dq, dk, dv) at full size; the engine's working set of one chunk (its own result
    before the copy into out, accumulators, gathers, block results, gradient parts, kernel scratch)."""
    items = {**_input_items(s, x_shard), "output": x_shard, "lse": s.batch * s.seq_len * s.heads * 4}
    if s.mode == "fwdbwd":
        items["gradients (upstream, dq, dk, dv)"] = 4 * x_shard
    one = s.model_copy(update={"seq_len": chunk, "documents": None})
    part = estimate_memory(one, 0, device_type, chunked=False)
    # combined chunks write out and the gradients straight into the whole call's (chunks.ChunkedAttention)
    blocks = _local_blocks(one, chunk, s.heads)
    combined = s.documents is None and combined_call(one, device_type, len(blocks))
    written = ("output", "gradients (upstream, dq, dk, dv)") if combined else ()
    for name, value in part.items.items():
        if name not in ("lse", *_input_items(s, x_shard), *written):
            items[f"one chunk of {chunk:,} positions: {name}"] = value
    if combined and s.mode == "fwdbwd":  # nothing is made for the gradients: their shares peak all together
        items[f"one chunk of {chunk:,} positions: block results (one-pass combine)"] = _combined_peak(one, blocks, 0)[0]
    return items


def _input_items(s: Problem, x_shard: int) -> dict[str, int]:
    """q, k, v; with GQA k, v at the kv heads, their copies repeated to H heads (every implementation computes on
    those), and in backward the kv-head dk, dv that autograd sums the repeated gradients into."""
    kv_shard = x_shard * s.kv_head_count // s.heads
    items = {"inputs q, k, v": x_shard + 2 * kv_shard}
    if kv_shard != x_shard:
        items["k, v repeated to H heads (GQA)"] = 2 * x_shard
        if s.mode == "fwdbwd":
            items["kv-head dk, dv (GQA)"] = 2 * kv_shard
    return items


def _dense_items(t: _Tally, s: Problem, x_shard: int, device_type: str) -> None:
    """A fused dense kernel (lse and workspace) or the N x N scores of the math form."""
    fwdbwd = s.mode == "fwdbwd"
    if s.spec.memory_model == "dense_scores":  # fp32 scores, softmax, (and their grads in backward)
        t.add("scores (N x N)", s.batch * s.heads * s.seq_len * s.seq_len * 4 * (3 if fwdbwd else 2))
    else:
        t.add("lse", s.batch * s.heads * s.seq_len * 4)
    if fwdbwd:
        t.add("gradients (upstream, dq, dk, dv)", 4 * x_shard)
    if s.spec.memory_model != "dense_scores":
        block_elems = s.batch * s.heads * s.seq_len * s.head_dim
        t.add("kernel workspace", _workspace("dense", s, device_type) * block_elems * ELEMENT_BYTES[s.dtype])


def _workspace(kind: str, s: Problem, device_type: str) -> float:
    """Kernel workspace in units of the largest block's q-sized tensor."""
    flash_backward = device_type == "cuda" and s.mode == "fwdbwd" and s.dtype in ("float16", "bfloat16")
    return WORKSPACE.get((kind, device_type, s.mode), 0.0) + (FLASH_BACKWARD_DQ_ACCUMULATOR if flash_backward else 0.0)


def _dilated_items(t: _Tally, s: Problem, length: int, x_shard: int, device_type: str) -> None:
    """The blocked engine: lse, accumulator, kept-row gathers, block results, gradients, comm buffers."""
    e = ELEMENT_BYTES[s.dtype]
    fwdbwd = s.mode == "fwdbwd"
    p = max(1, s.world_size)
    heads, work_len = s.heads, length
    if s.strategy == "head_parallel":
        heads, work_len = s.heads // p, length * p  # the whole (padded) sequence of H/p heads
    blocks = _local_blocks(s, work_len, heads)
    x_work = s.batch * work_len * heads * s.head_dim * e
    acc_e = accumulator_dtype(getattr(torch, s.dtype)).itemsize
    improved = s.spec.memory_model == "strided"
    combined = combined_call(s, device_type, len(blocks))
    t.add("lse", s.batch * length * s.heads * 4)
    if e != acc_e and not combined:
        t.add("fp32 accumulator", s.batch * work_len * heads * s.head_dim * acc_e)
    gather_shapes: dict[tuple, int] = {}
    largest, largest_free = 0, 0
    for b in blocks:
        elems = _block_elems(s.batch, b, s.head_dim)
        largest = max(largest, elems)
        if not _covers_all(b, work_len, heads):
            largest_free = max(largest_free, elems)
        if b.rate > 1 or not improved:
            gather_shapes[(b.num_segments, b.num_heads, b.rows)] = elems
    if improved:
        if not (device_type == "cuda" and s.head_dim * e % 16 == 0):  # CUDA kernels take r > 1 blocks as views
            t.add("gather buffers (memory pool)", (5 if fwdbwd else 3) * sum(gather_shapes.values()) * e)
    else:  # index gathers live one block at a time, plus the index tensors of every block (int64)
        t.add("gather buffers", (5 if fwdbwd else 3) * max(gather_shapes.values(), default=0) * e)
        t.add("index tensors", sum(_block_elems(s.batch, b, 1) // s.batch * 8 for b in blocks))
        t.add("merge copies", 2 * largest * e)
    if combined:  # every block's (out, lse), or its (dq, dk, dv), kept until the one pass (kernels/combine.py)
        results, grads = _combined_peak(s, blocks, x_work)
        t.add("block results (one-pass combine)", results)
    else:
        # a block result is adopted as the accumulator only in the accumulator's dtype (engine._adopt): with half
        # inputs every block's result, the covering one's too, is a separate tensor
        t.add("block result", (largest_free if e == acc_e else largest) * (3 if fwdbwd else 1) * e)
    if fwdbwd:
        t.add("gradients (upstream, dq, dk, dv)", grads if combined else 4 * x_work)
    if s.strategy == "head_parallel":
        t.add("all-to-all copies", 2 * x_shard * (2 if fwdbwd else 1))
        t.add("head-shard q, k, v, out", 4 * x_work)
    elif s.strategy in ("ring", "allgather"):
        t.add("comm buffers", _sequence_parallel_buffers(s, fwdbwd))
    # the combine's peak is at the last block's backward, beside every other block's gradients
    workspace_block = _block_elems(s.batch, blocks[-1], s.head_dim) if combined and blocks else largest
    t.add("kernel workspace", _workspace("dilated", s, device_type) * workspace_block * e)


def _combined_peak(s: Problem, blocks: list[Block], x_work: int) -> tuple[int, int]:
    """(block results, gradients) at the one-pass combine's peak. Forward: every block's (out, lse). Backward:
    dq, dk, dv are made one by one, each summed from its shares, which are then freed (engine._backward_combined),
    so the peak is the largest of upstream + j + 1 gradients beside 3 - j sets of shares."""
    e = ELEMENT_BYTES[s.dtype]
    shares = sum(_block_elems(s.batch, b, s.head_dim) for b in blocks) * e
    if s.mode != "fwdbwd":
        return shares + sum(_block_elems(s.batch, b, 1) for b in blocks) * 4, 0
    stages = [((3 - j) * shares, (2 + j) * x_work) for j in range(3)]
    return max(stages, key=sum)


def combined_call(s: Problem, device_type: str, num_blocks: int) -> bool:
    """The planner's one rule for whether `s`'s engine combines its `num_blocks` blocks in one pass: the
    strided-view engine with no key blocks from other ranks (single-device, head-parallel, and a sequence-parallel
    call whose segments all fit in a shard, kernels/distributed/sequence_parallel.py)."""
    if s.spec.memory_model != "strided" or s.strategy not in ("single", "head_parallel", "ring", "allgather"):
        return False
    if s.strategy in ("ring", "allgather") and spanning_pairs(s):
        return False
    return combine.expected(device_type, getattr(torch, s.dtype), num_blocks, s.head_dim)


def _sequence_parallel_buffers(s: Problem, fwdbwd: bool) -> int:
    """Packed sparsified K/V, S = packed_kv_bytes per device and pair: the ring holds its own rows, the
    buffer being computed on and the one being received (and a dK/dV share in backward); the all-gather
    holds all g members' rows (kept for backward) and, in backward, the g dK/dV shares."""
    total = 0
    for g, r, heads in spanning_pairs(s):
        size = packed_kv_bytes(s, heads, r)
        if s.strategy == "ring":
            total = max(total, size * (4 if fwdbwd else 3))
        else:
            total += size * (2 * g if fwdbwd else g)
    return total


def reference_items(s: Problem) -> dict[str, int]:
    """The float64 reference baseline: one dense reference call as workload/check_memory.py models it (its
    float64 copies, out, gradients and, with backward, the scores autograd saves), beside its inputs."""
    from ..workload.check_memory import input_bytes, reference_items as reference_call

    return {"inputs": input_bytes(s), **reference_call(s, local=False, chunk_elements=0)}


# Reserved over allocated on a GPU: torch's caching allocator rounds each block up (512-byte blocks, 2 MiB
# segments for large ones) and holds freed blocks it cannot hand to a larger request, and published peaks are mostly
# torch.cuda.max_memory_reserved or nvidia-smi readings. A stated margin on the tensor bytes (the framework item
# already holds the context): 10%, a floor below the one measurement there is, `dattn profile` on the H200
# (benchmarks/gpu/h200_run2/profile_cuda.json, a 1.2 GB run): reserved 1.11x and 1.15x the allocated peak with and
# without its caches. Not fitted: issue 29's validation (part C) fits it on rows it names.
ALLOCATOR_MARGIN = 0.10


def reserved_bytes(memory: MemoryBreakdown, profile: HardwareProfile) -> int | None:
    """The reserved peak a GPU reports for `memory` (ALLOCATOR_MARGIN on its tensor bytes); None on a CPU."""
    if profile.kind != "gpu":
        return None
    framework = memory.items.get("framework", 0)
    return int(framework + (memory.total - framework) * (1 + ALLOCATOR_MARGIN))


def framework_bytes(profile: HardwareProfile, mode: str) -> int:
    """The runtime's fixed cost from the profile (CUDA context, allocator reserve; CPU thread pools)."""
    return int((profile.framework_overhead_gib + (profile.backward_overhead_gib if mode == "fwdbwd" else 0.0)) * 2**30)


def _finish(t: _Tally, framework_bytes: int, replace: dict[str, int] | None = None) -> MemoryBreakdown:
    if replace is not None:
        t.items = dict(replace)
    if framework_bytes:
        t.add("framework", framework_bytes)
    return MemoryBreakdown(items=t.items, total=sum(t.items.values()))
