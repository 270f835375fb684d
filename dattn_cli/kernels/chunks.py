"""Long single-device calls computed one stretch of the sequence at a time.

Every segment of every (segment length, dilation) pair lies inside one stretch of lcm(segment lengths)
positions that starts at a multiple of it (a ragged tail inside the last one), and no attention crosses a
segment. So a call over N can be computed as independent calls over consecutive chunks whose length is a
multiple of that alignment: the same blocks, the same sums, the same result bit for bit (the blocks of each
chunk run in the same order on the same rows). What changes is memory: the engine's working set (fp32
accumulators of the output and of dq, dk, dv, gathered rows, each block's result, the kernel's own scratch)
exists for one chunk instead of the whole sequence; only q, k, v, out, lse and the gradients are full size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from .backends import accumulator_dtype
from .engine import BlockAttention

# Positions per chunk such that one (B, chunk, H, D) tensor holds at most this many elements (rounded down to the
# alignment, at least one alignment): 2**27 elements = 256 MiB in bf16, 16 chunks for N = 8M, H = 8, D = 64.
SEQUENCE_CHUNK_ELEMENTS = 1 << 27


def chunk_length(
    batch: int,
    seq_len: int,
    heads: int,
    head_dim: int,
    segment_lengths: Sequence[int],
    max_elements: int | None = SEQUENCE_CHUNK_ELEMENTS,
) -> int | None:
    """Positions per chunk, or None when one call covers N (short N, no limit, or alignment >= N)."""
    if not max_elements:
        return None
    align = math.lcm(*segment_lengths)
    length = max(align, max_elements // max(1, batch * heads * head_dim) // align * align)
    return length if length < seq_len else None


def chunk_bounds(seq_len: int, length: int) -> list[tuple[int, int]]:
    return [(start, min(seq_len, start + length)) for start in range(0, seq_len, length)]


@dataclass
class ChunkedAttention:
    """BlockAttention's forward/backward over (start, end, attention) chunks of the sequence (dim 1)."""

    chunks: list[tuple[int, int, BlockAttention]]

    @staticmethod
    def reseeded(attention: BlockAttention, index: int) -> BlockAttention:
        """Each chunk its own dropout seeds (blocks are numbered from 0 in every chunk)."""
        return replace(attention, call=replace(attention.call, seed=attention.call.seed + 7_919_993 * index))

    def forward(self, q, k, v, key_pad=None) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:3], dtype=accumulator_dtype(q.dtype))
        for start, end, attention in self.chunks:  # each chunk writes its slices of out and lse
            part = [x[:, start:end] for x in (q, k, v)]
            kp = None if key_pad is None else key_pad[:, start:end]
            attention.forward(*part, kp, into=(out[:, start:end], lse[:, start:end]))
        return out, lse

    def backward(self, dout, q, k, v, out, lse, key_pad=None) -> tuple[torch.Tensor, ...]:
        grads = [torch.empty_like(x) for x in (q, k, v)]  # each chunk's BlockAttention casts its dout slice
        for start, end, attention in self.chunks:
            part = [x[:, start:end] for x in (dout, q, k, v, out, lse)]
            kp = None if key_pad is None else key_pad[:, start:end]
            attention.backward(*part, kp, into=tuple(g[:, start:end] for g in grads))
        return tuple(grads)
