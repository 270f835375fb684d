"""The fast path of merge.py: one Triton pass per merge or gradient add, chosen here and only here.

`merge_` and `accumulate_` return False, having touched nothing, whenever the fast path does not apply;
merge.py then runs its torch code. The fast path applies when
* DATTN_FUSED_MERGE is not "0" (set it to 0 to measure the torch code instead);
* triton is importable and the tensors are on CUDA, or TRITON_INTERPRET=1 (triton's interpreter, for tests);
* the accumulators are fp32 and the block is fp32, fp16 or bf16 (fp64 stays on torch);
* shapes match exactly and the leading dimensions collapse to at most four (any strides otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch

ENV = "DATTN_FUSED_MERGE"
BLOCK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DIMS = 4
MAX_D = 1024  # widest row one program holds


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def enabled(device: torch.device) -> bool:
    """Whether the fast path may run on `device` at all (environment, triton, device)."""
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    return (device.type == "cuda" or _interpret()) and _triton_importable()


def _collapse(shape, strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]] | None:
    """Leading `shape` with every tensor's `strides` over it, adjacent dimensions merged where all tensors
    allow, size-1 dimensions dropped, padded in front to MAX_DIMS; None if more dimensions remain."""
    sizes: list[int] = []
    kept: list[list[int]] = [[] for _ in strides]
    for dim in range(len(shape) - 1, -1, -1):  # innermost first
        size = shape[dim]
        if size == 1:
            continue
        if sizes and all(st[dim] == k[0] * sizes[0] for st, k in zip(strides, kept)):
            sizes[0] *= size
            continue
        sizes.insert(0, size)
        for st, k in zip(strides, kept):
            k.insert(0, st[dim])
    if len(sizes) > MAX_DIMS:
        return None
    pad = MAX_DIMS - len(sizes)
    return [1] * pad + sizes, [[0] * pad + k for k in kept]


def _launch(merge: bool, acc, lse, block, blse) -> bool:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (acc, lse, block, blse)):
        return False  # the kernel is invisible to autograd
    lead, d = acc.shape[:-1], acc.shape[-1]
    if d == 0 or d > MAX_D or acc.numel() == 0:
        return False
    tensors = [acc, lse, block, blse] if merge else [acc, block]
    layout = _collapse(lead, [tuple(t.stride()[: len(lead)]) for t in tensors])
    if layout is None:
        return False
    sizes, strides = layout
    written = [strides[0], strides[1]] if merge else [strides[0]]
    if any(st == 0 and n > 1 for w in written for n, st in zip(sizes, w)) or (acc.stride(-1) == 0 and d > 1):
        return False  # a broadcast accumulator would be written by several rows at once
    if not merge:
        strides = [strides[0], [0] * MAX_DIMS, strides[1], [0] * MAX_DIMS]
        lse = blse = acc
    a, l_, b, c = strides
    from triton import knobs

    from .merge_triton import build

    if acc.device.type != "cuda" and not knobs.runtime.interpret:
        return False  # triton read TRITON_INTERPRET otherwise than _interpret

    rows = acc.numel() // d
    block_d = 1 << (d - 1).bit_length()
    block_r = max(1, min(64, 4096 // block_d))
    grid = ((rows + block_r - 1) // block_r,)
    with torch.cuda.device(acc.device) if acc.device.type == "cuda" else contextlib.nullcontext():
        build(bool(knobs.runtime.interpret))[grid](
            acc, lse, block, blse, rows, d, *sizes[1:],
            *a, acc.stride(-1), *l_, *b, block.stride(-1), *c,
            MERGE=merge, BLOCK_R=block_r, BLOCK_D=block_d,
        )  # fmt: skip
    return True


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> bool:
    """merge.merge_partial_ in one pass, if the fast path applies; False (nothing done) otherwise."""
    if not enabled(out.device) or out.dtype != torch.float32 or block_out.dtype not in BLOCK_DTYPES:
        return False
    if lse.dtype != torch.float32 or block_lse.dtype != torch.float32:
        return False
    if block_out.shape != out.shape or lse.shape != out.shape[:-1] or block_lse.shape != lse.shape:
        return False
    if any(t.device != out.device for t in (lse, block_out, block_lse)):
        return False
    return _launch(True, out, lse, block_out, block_lse)


def accumulate_(acc: torch.Tensor, value: torch.Tensor) -> bool:
    """acc += value (cast to acc's dtype) in one pass, if the fast path applies; False otherwise."""
    if not enabled(acc.device) or acc.dtype != torch.float32 or value.dtype not in BLOCK_DTYPES:
        return False
    if value.shape != acc.shape or value.device != acc.device or acc.dim() == 0:
        return False
    return _launch(False, acc, None, value, None)
