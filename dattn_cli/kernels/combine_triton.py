"""Triton source of the one-pass combine (launched by combine.py).

One program takes BLOCK_R rows of the destination (B, N, H, D), a row being one (b, n, h) vector of D. For each
of the K blocks (a static loop) it works out whether the block holds that row and where: the block's segment
and kept-row index from n, its head index from h (pattern.Block's geometry: GEO_INTS int64 per block, one row
of the device tensor `geo`), and loads the row from the block's result through its own strides. With MERGE it
merges the blocks' (out, lse) online (a running maximum of the lse, as flash attention does over key tiles)
and writes out and lse once; without, it sums the gradient shares. Arithmetic is fp32 whatever the block dtype
(half loads are upcast: the interpreter mishandles bf16 arithmetic, triton#11584); the destination gets one
rounding.

`triton.jit` reads TRITON_INTERPRET when it decorates, so `build` decorates once per setting.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

# per block: start, seg_len, num_segments, offset, rate, head_start, head_step, num_heads (int32 range: the
# caller clamps rate and head_step), the result's strides (segment-batch, row, head, d: 1) and its lse's
# (segment-batch, row, head)
GEO_INTS = 15


def _combine(
    dst, dlse, parts, lses, geo, R, N, H, D, y0, y1, y2, z0, z1, z2,
    K: tl.constexpr, MERGE: tl.constexpr, GEO_INTS: tl.constexpr, ALIGN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < R
    h = (r % H).to(tl.int32)
    t = r // H
    n = (t % N).to(tl.int32)
    b = t // N
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    cmask = cols < D
    acc = tl.full((BLOCK_R, BLOCK_D), 0.0, tl.float32)  # not tl.zeros: a jit function the interpreter misses
    top = tl.full((BLOCK_R,), float("-inf"), tl.float32)  # MERGE: the largest lse so far
    total = tl.full((BLOCK_R,), 0.0, tl.float32)  # MERGE: sum of exp(lse - top)
    for k in tl.static_range(K):
        g = geo + k * GEO_INTS  # positions and heads fit int32: the index arithmetic stays there
        start, seg_len = tl.load(g).to(tl.int32), tl.load(g + 1).to(tl.int32)
        segs, offset, rate = tl.load(g + 2).to(tl.int32), tl.load(g + 3).to(tl.int32), tl.load(g + 4).to(tl.int32)
        h0, hstep, nh = tl.load(g + 5).to(tl.int32), tl.load(g + 6).to(tl.int32), tl.load(g + 7).to(tl.int32)
        rel = n - start
        inside = (rel >= 0) & (rel < segs * seg_len)
        rel = tl.where(inside, rel, 0)
        seg = rel // seg_len
        pos = rel - seg * seg_len - offset
        hrel = h - h0
        hj = tl.where(hrel >= 0, hrel, 0) // hstep
        held = inside & (pos >= 0) & (tl.where(pos >= 0, pos, 0) % rate == 0) & (hrel >= 0) & (hrel == hj * hstep)
        held = held & (hj < nh) & rmask
        i = tl.where(held, pos, 0) // rate
        sb = b * segs + tl.where(held, seg, 0).to(tl.int64)
        row = sb * tl.load(g + 8) + i.to(tl.int64) * tl.load(g + 9) + hj.to(tl.int64) * tl.load(g + 10)
        row = tl.multiple_of(row, ALIGN)  # every stride a multiple of ALIGN, the last one 1: vector loads
        ptrs = parts[k] + row[:, None] + cols[None, :]
        x = tl.load(ptrs, mask=held[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        if MERGE:
            lrow = sb * tl.load(g + 12) + i.to(tl.int64) * tl.load(g + 13) + hj.to(tl.int64) * tl.load(g + 14)
            lse = tl.load(lses[k] + lrow, mask=held, other=float("-inf")).to(tl.float32)
            new_top = tl.maximum(top, lse)
            base = tl.where(new_top == float("-inf"), 0.0, new_top)  # no block yet: measure against 0, not -inf
            keep, weight = tl.exp(top - base), tl.exp(lse - base)
            acc = acc * keep[:, None] + x * weight[:, None]
            total = total * keep + weight
            top = new_top
        else:
            acc += x
    if MERGE:  # a row no block holds: out 0, lse -inf; a NaN stays NaN
        acc = acc / tl.where(total == 0, 1.0, total)[:, None]
        lse_out = tl.where(total == 0, float("-inf"), tl.where(top == float("-inf"), 0.0, top) + tl.log(total))
        tl.store(dlse + b * z0 + n.to(tl.int64) * z1 + h.to(tl.int64) * z2, lse_out, mask=rmask)
    dst_row = b * y0 + n.to(tl.int64) * y1 + h.to(tl.int64) * y2
    tl.store(dst + dst_row[:, None] + cols[None, :], acc.to(dst.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@functools.cache
def build(interpret: bool):
    """The combine kernel, decorated under the caller's TRITON_INTERPRET setting `interpret`."""
    return triton.jit(_combine)
