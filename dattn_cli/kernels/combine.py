"""The blocks' results combined in one pass: merged (out, lse) in forward, summed gradients in backward.

The engine's accumulating path (merge.py: fp32 accumulators, one merge or add per block, casts before and
after) moves about 20 bytes per output element and launches a kernel per block; at N = 1M on an H100 it took
23 of 86 ms (benchmarks/RESULTS.md). Where this applies, the engine keeps every block's result instead and
writes each destination row once: it reads every block's share of the row, merges or sums it in fp32 and
stores the result in the destination's dtype (about 5.5 bytes per element for the LongNet pattern of three
pairs). The math is the merge routine's (merge.py); only the order of the fp32 operations differs.

It applies (`applies`) where merge_fused.py's fast path may run (CUDA or TRITON_INTERPRET=1, triton installed,
DATTN_FUSED_MERGE not 0), with at most MAX_BLOCKS blocks of strided-view rows (ViewAccess) and no key blocks
beyond the engine's own: the single-device module (also inside head-parallel) and a sequence-parallel call whose
segments all fit in a shard; the exchanges of spanning segments merge into fp32 accumulators. Blocks whose
integers pass int32 (after clamping a rate past the segment, a head step past the heads) and results whose last
dimension is strided are merged block by block from the kept results (merge.py, into fp32). A launch that fails
(an import, a build, a CUDA graph capture) is merged so too, and turns the combine off for the process, said
once: later calls take the accumulating path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Sequence

import torch

from . import merge_fused
from .merge import accumulate_, merge_partial_
from .pattern import Block

MAX_BLOCKS = 16  # the kernel unrolls one load per block
BLOCK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
log = logging.getLogger(__name__)
_failed: list[str] = []


def applies(x: torch.Tensor, num_blocks: int) -> bool:
    """Whether the engine may combine its `num_blocks` results for inputs like `x` in one pass."""
    return (
        not _failed
        and 0 < num_blocks <= MAX_BLOCKS
        and x.dtype in BLOCK_DTYPES
        and 0 < x.shape[-1] <= merge_fused.MAX_D
        and merge_fused.enabled(x.device)
    )


PATHS = ("one-pass", "accumulating")  # how the engine merged its blocks, as bench rows record it (merge_path)
_used: dict[str, None] = {}  # paths taken since reset_paths(), in first-use order
_assumed: list[str] = []  # the planner's override (assume)


def note_path(path: str) -> None:
    _used.setdefault(path, None)


def paths_used() -> str | None:
    """The merge paths the engine took since the last reset, '+'-joined; None: no engine call."""
    return "+".join(_used) or None


def reset_paths() -> None:
    _used.clear()


@contextlib.contextmanager
def assume(path: str):
    """Within the block, `expected` answers for `path` (one of PATHS): plan --check models each bench row on the
    path its engine took (rows from before the combine took the accumulating one)."""
    _assumed.append(path)
    try:
        yield
    finally:
        _assumed.pop()


def expected(device_type: str, dtype: torch.dtype, num_blocks: int, head_dim: int) -> bool:
    """The planner's view of `applies` for an engine call of strided-view rows on `device_type`: on CUDA
    (triton ships with torch's CUDA builds), elsewhere only under triton's interpreter; never with
    DATTN_FUSED_MERGE=0, nor within assume("accumulating")."""
    shape = 0 < num_blocks <= MAX_BLOCKS and dtype in BLOCK_DTYPES and 0 < head_dim <= merge_fused.MAX_D
    if _assumed:
        return _assumed[-1] == "one-pass" and shape
    if _failed or os.environ.get(merge_fused.ENV, "1").strip() == "0":
        return False
    here = device_type == "cuda" or (merge_fused._interpret() and merge_fused._triton_importable())
    return here and shape


INT32 = 1 << 31
K_SIZES = (2, 4, 8, MAX_BLOCKS)  # block counts the kernel is built for; the rest of a call's slots hold nothing
EMPTY_BLOCK = (0, 1, 0, 0, 1, 0, 1, 0) + (0,) * 7  # no segments, no heads: no row is held


def _geometry(block: Block, part: torch.Tensor, lse: torch.Tensor | None, heads: int) -> tuple[int, ...] | None:
    """The kernel's integers for one block; None where it cannot take them (its index arithmetic is int32)."""
    lse_strides = tuple(lse.stride()) if lse is not None else (0, 0, 0)
    # a rate past the segment keeps one row and a head step past the heads one head: the same rows, in int32
    rate, head_step = min(block.rate, block.seg_len), min(block.head_step, heads)
    pattern = (block.start, block.seg_len, block.num_segments, block.offset, rate, block.head_start, head_step)
    if max(*pattern, block.num_heads, block.start + block.num_segments * block.seg_len) >= INT32:
        return None
    return (*pattern, block.num_heads, *part.stride(), *lse_strides)


def _alignment(parts) -> int:
    """The largest power of two up to 16 that divides every stride but the last (contiguous) one of every block
    result: the kernel's hint that a row starts there (so that its loads are vectors)."""
    align = 16
    for part in parts:
        for stride in part.stride()[:-1]:
            while stride % align:
                align //= 2
    return align


@functools.lru_cache(maxsize=256)
def _device_geometry(geometry: tuple[tuple[int, ...], ...], device: torch.device) -> torch.Tensor:
    """The blocks' geometry as an int64 tensor on `device`, made once per geometry (a host-to-device copy
    waits for the stream; the kernel's integer arguments would compile a variant per shape)."""
    return torch.tensor(geometry, dtype=torch.int64, device=device)


def _launch(dst, dst_lse, blocks: Sequence[Block], parts, lses) -> bool:
    merge = dst_lse is not None
    if dst.stride(-1) != 1 or any(p.stride(-1) != 1 for p in parts):
        return False  # rows are loaded and stored as contiguous vectors
    batch, n, h, d = dst.shape
    geometry = [_geometry(b, p, l_, h) for b, p, l_ in zip(blocks, parts, lses if merge else [None] * len(parts))]
    if any(g is None for g in geometry):
        return False
    k = next(size for size in K_SIZES if size >= len(parts))  # a few kernel variants, not one per block count
    geometry += [EMPTY_BLOCK] * (k - len(parts))
    parts = [*parts, *[parts[0]] * (k - len(parts))]
    lses = [*lses, *[lses[0]] * (k - len(lses))] if merge else parts
    rows = batch * n * h
    block_d = 1 << (d - 1).bit_length()
    block_r = max(1, min(64, 4096 // block_d))
    lse_strides = dst_lse.stride() if merge else (0, 0, 0)
    try:  # any import, geometry copy (a CUDA graph capture, say), build or launch failure: the accumulating path
        from triton import knobs

        from .combine_triton import GEO_INTS, build

        if dst.device.type != "cuda" and not knobs.runtime.interpret:
            return False  # triton read TRITON_INTERPRET otherwise than merge_fused
        geo = _device_geometry(tuple(geometry), dst.device)
        with torch.cuda.device(dst.device) if dst.device.type == "cuda" else contextlib.nullcontext():
            build(bool(knobs.runtime.interpret))[((rows + block_r - 1) // block_r,)](
                dst, dst_lse if merge else dst, tuple(parts), tuple(lses), geo,
                rows, n, h, d, *dst.stride()[:3], *lse_strides,
                K=k, MERGE=merge, GEO_INTS=GEO_INTS, ALIGN=_alignment(parts),
                BLOCK_R=block_r, BLOCK_D=block_d,
            )  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        _failed.append(f"{type(exc).__name__}: {exc}")
        message = f"dattn: the one-pass combine failed ({_failed[0][:200]}); merging block by block instead"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return False
    return True


def _by_blocks(dst, dst_lse, blocks: Sequence[Block], parts, lses) -> None:
    """The kernel's result by merge.py's routine, block by block into fp32 (where the kernel cannot run: the
    results are kept, so nothing is computed again). Consumes the parts (scaled in place)."""
    acc = dst if dst.dtype == torch.float32 else torch.empty(dst.shape, dtype=torch.float32, device=dst.device)
    acc.zero_()
    if dst_lse is not None:
        dst_lse.fill_(float("-inf"))
    for i, (block, part) in enumerate(zip(blocks, parts)):
        part = part.unflatten(0, (-1, block.num_segments))
        if dst_lse is None:
            accumulate_(block.view(acc), part)
        else:
            merge_partial_(block.view(acc), block.view(dst_lse), part, lses[i].unflatten(0, (-1, block.num_segments)))
    if acc is not dst:
        dst.copy_(acc)


def merge_into(out, lse, blocks: Sequence[Block], parts, part_lses) -> None:
    """out (B, N, H, D), lse (B, N, H) fp32 := the merge of every block's (out (b, m, h, D), lse (b, m, h)),
    b = B * segments; rows no block holds get 0 and -inf."""
    if not _launch(out, lse, blocks, parts, part_lses):
        _by_blocks(out, lse, blocks, parts, part_lses)


def sum_into(grad, blocks: Sequence[Block], parts) -> None:
    """grad (B, N, H, D) := the sum of every block's share (b, m, h, D); 0 where no block holds a row."""
    if not _launch(grad, None, blocks, parts, None):
        _by_blocks(grad, None, blocks, parts, None)
