"""Triton source of the fused merge and gradient add (selected and launched by merge_fused.py).

One kernel walks rows: a row is one (..., D) vector, its leading index decomposed over four dimensions of
sizes (S0, S1, S2, S3) with each tensor's own strides, so strided views of the accumulators are read and
written in place, in one pass. With MERGE it merges a block's (out, lse) into the accumulators (out, lse);
without, it adds a gradient share into an accumulator. Arithmetic is fp32 whatever the block's dtype: half
inputs are upcast on load (the interpreter mishandles bf16 arithmetic, triton#11584; converting on load
avoids it).

`triton.jit` reads TRITON_INTERPRET when it decorates, so `build` decorates once per setting: the
interpreter's kernel for tests on CPU, the compiled one for CUDA, both possible in one process.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl


def _rows(
    acc, lse, block, blse, R, D, S1, S2, S3,
    a0, a1, a2, a3, ad, l0, l1, l2, l3, b0, b1, b2, b3, bd, c0, c1, c2, c3,
    MERGE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < R
    i3 = r % S3
    t = r // S3
    i2 = t % S2
    t = t // S2
    i1 = t % S1
    i0 = t // S1
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    mask = rmask[:, None] & (cols < D)[None, :]
    acc_ptr = acc + (i0 * a0 + i1 * a1 + i2 * a2 + i3 * a3)[:, None] + cols[None, :] * ad
    block_ptr = block + (i0 * b0 + i1 * b1 + i2 * b2 + i3 * b3)[:, None] + cols[None, :] * bd
    total = tl.load(acc_ptr, mask=mask, other=0.0).to(tl.float32)
    part = tl.load(block_ptr, mask=mask, other=0.0).to(tl.float32)
    if MERGE:
        lse_ptr = lse + i0 * l0 + i1 * l1 + i2 * l2 + i3 * l3
        lse_a = tl.load(lse_ptr, mask=rmask, other=float("-inf")).to(tl.float32)
        lse_b = tl.load(blse + i0 * c0 + i1 * c1 + i2 * c2 + i3 * c3, mask=rmask, other=float("-inf"))
        lse_b = lse_b.to(tl.float32)
        # logaddexp from the larger side, or from 0 where both are -inf (the sum is then 0, its log -inf)
        top = tl.maximum(lse_a, lse_b)
        top = tl.where(top == float("-inf"), 0.0, top)
        new = top + tl.log(tl.exp(lse_a - top) + tl.exp(lse_b - top))
        base = tl.where(new == float("-inf"), 0.0, new)
        total = tl.exp(lse_a - base)[:, None] * total + tl.exp(lse_b - base)[:, None] * part
        tl.store(lse_ptr, new.to(lse.dtype.element_ty), mask=rmask)
    else:
        total = total + part
    tl.store(acc_ptr, total.to(acc.dtype.element_ty), mask=mask)


@functools.cache
def build(interpret: bool):
    """The row kernel, decorated under the caller's TRITON_INTERPRET setting `interpret`."""
    return triton.jit(_rows)
