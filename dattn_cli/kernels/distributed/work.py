"""Attention work per rank: the exact (query, key) pairs each query position attends, and their sums over the
rows a rank holds. One definition for the planner (plan/layouts.py), the layout benchmarks
(benchmarks/zigzag_balance.py, benchmarks/document_balance.py) and the documents layout (document_layout.py).

A pair is counted on the rank that holds its query: the ring, all-gather and block-sparse ring keep queries on
their rank. Head-parallel ranks hold every position at H/p heads (`head_range`); the hybrid's rank (b, j) the
positions of ring shard b at head shard j.

Dilated pattern (docs/semantics.md): in a segment of ŵ = min(w, N) positions (the last one shorter when N is not a
multiple of ŵ), a head set with offset o keeps the in-segment indices u ≡ o (mod r), u >= o; a kept row attends
every kept row of its segment, or, causal, the j-th kept row j + 1 of them. Positions not kept attend nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..pattern import head_sets


def pairs_per_position(
    n: int,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    heads: int,
    semantics: str = "longnet",
    causal: bool = True,
    head_range: tuple[int, int] | None = None,
) -> torch.Tensor:
    """(n,) int64: the (query, key) pairs each query position attends, summed over the heads of `head_range`
    (first, end; default all `heads`) and over the pattern's pairs."""
    first, end = head_range or (0, heads)
    pos = torch.arange(n)
    total = torch.zeros(n, dtype=torch.int64)
    for pair, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        span = max(1, min(w, n))
        u = pos % span
        length = torch.clamp(n - (pos - u), max=span)  # the segment's length (the last one may be shorter)
        for offset, _, _, count in head_sets(pair, r, end - first, len(segment_lengths), semantics, first, heads):
            kept = (u % r == offset % r) & (u >= offset)
            seen = (u - offset) // r + 1 if causal else (length - offset + r - 1) // r
            total += torch.where(kept, seen, 0) * count
    return total


def document_pairs_per_position(
    documents: Sequence[int],
    segment_lengths: Sequence[int] | None,
    dilation_rates: Sequence[int] | None,
    heads: int,
    semantics: str = "longnet",
    causal: bool = True,
) -> torch.Tensor:
    """(T,) int64 for packed documents, each attended on its own; no pattern (None): dense attention."""
    parts = []
    for n in documents:
        segments, rates = (segment_lengths, dilation_rates) if segment_lengths is not None else ([n], [1])
        parts.append(pairs_per_position(n, segments, rates, heads, semantics, causal))
    return torch.cat(parts)


def block_pairs_per_position(table: torch.Tensor, block_size: int, heads: int, causal: bool) -> torch.Tensor:
    """(blocks·block_size,) int64 for a block table (query block x key block, True = attend), the same for every
    head: a causal query attends the key blocks before its own whole and its own block up to itself."""
    blocks = table.shape[0]
    pos = torch.arange(blocks * block_size)
    if causal:
        before = torch.tril(table, diagonal=-1).sum(1) * block_size
        own = torch.where(table.diagonal()[pos // block_size], pos % block_size + 1, 0)
        return (before[pos // block_size] + own) * heads
    return table.sum(1)[pos // block_size] * block_size * heads


def rank_work(per_position: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(world,) int64: the pairs of each rank's rows; positions (world, L) are global positions, -1 (padding) and
    positions past the end attending nothing."""
    flat = positions.reshape(-1)
    real = (flat >= 0) & (flat < per_position.numel())
    work = torch.where(real, per_position[flat.clamp(0, per_position.numel() - 1)], 0)
    return work.view(positions.shape).sum(1)
