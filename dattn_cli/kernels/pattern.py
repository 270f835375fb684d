"""The dilated pattern of docs/semantics.md as a list of blocks of kept rows.

A block is one dense attention problem: for `num_segments` segments of length `seg_len` starting at
`start`, the rows at in-segment index `offset, offset + rate, ...` of heads
`head_start, head_start + head_step, ...`. Every row of a block attends to every (earlier, if causal)
row of the same segment in the same block, so one backend call per block computes one pair's
contribution exactly; merging the blocks' (out, lse) gives the full result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SEMANTICS = ("longnet", "head_groups")


@dataclass(frozen=True)
class Block:
    pair: int
    start: int
    num_segments: int
    seg_len: int
    offset: int
    rate: int
    head_start: int
    head_step: int
    num_heads: int

    @property
    def rows(self) -> int:
        """Kept rows per segment."""
        return -(-(self.seg_len - self.offset) // self.rate)

    def positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Sequence positions of the kept rows, shape (num_segments, rows)."""
        seg = torch.arange(self.num_segments, device=device).unsqueeze(1) * self.seg_len
        row = torch.arange(self.rows, device=device) * self.rate + self.offset
        return self.start + seg + row

    def heads(self, device: torch.device | str | None = None) -> torch.Tensor:
        return self.head_start + torch.arange(self.num_heads, device=device) * self.head_step

    def flat_index(self, num_heads: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Indices into a (N * H) flattening, shape (num_segments, rows, heads)."""
        pos = self.positions(device).unsqueeze(-1)
        return pos * num_heads + self.heads(device)

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """Strided view of this block's rows of x (B, N, H, ...) as (B, segments, rows, heads, ...)."""
        end = self.start + self.num_segments * self.seg_len
        seg = x[:, self.start : end].unflatten(1, (self.num_segments, self.seg_len))
        last_head = self.head_start + self.head_step * (self.num_heads - 1) + 1
        return seg[:, :, self.offset :: self.rate, self.head_start : last_head : self.head_step]

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        """`view(x)` as one as_strided call (the engine's gathers, outside autograd: fewer host operations)."""
        s = x.stride()
        size = (x.shape[0], self.num_segments, self.rows, self.num_heads, *x.shape[3:])
        stride = (s[0], self.seg_len * s[1], self.rate * s[1], self.head_step * s[2], *s[3:])
        offset = x.storage_offset() + (self.start + self.offset) * s[1] + self.head_start * s[2]
        return x.as_strided(size, stride, offset)

    def pairs_attended(self, batch: int, causal: bool) -> int:
        """(query, key) pairs this block computes, over batch and heads."""
        m = self.rows
        per_segment = m * (m + 1) // 2 if causal else m * m
        return batch * self.num_segments * self.num_heads * per_segment


def validate_pattern(
    segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str = "longnet"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Check a pattern and return it as tuples; raise ValueError naming the parameter and the fix."""
    if segment_lengths is None or dilation_rates is None:
        raise ValueError("segment_lengths and dilation_rates are required, e.g. [2048, 4096] and [1, 2]")
    if isinstance(segment_lengths, int) or isinstance(dilation_rates, int):
        raise ValueError("segment_lengths and dilation_rates must be lists of ints, e.g. [2048, 4096] and [1, 2]")
    segs, rates = tuple(segment_lengths), tuple(dilation_rates)
    if len(segs) == 0:
        raise ValueError("segment_lengths is empty: give at least one segment length, e.g. [2048]")
    if len(segs) != len(rates):
        raise ValueError(
            f"segment_lengths has {len(segs)} entries but dilation_rates has {len(rates)}: "
            "give one dilation rate per segment length"
        )
    for name, values in (("segment_lengths", segs), ("dilation_rates", rates)):
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must hold positive integers, got {value!r}: use values >= 1")
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics={semantics!r} is unknown: use one of {', '.join(SEMANTICS)}")
    return segs, rates


def head_sets(
    pair: int,
    rate: int,
    num_heads: int,
    num_pairs: int,
    semantics: str,
    first_head: int = 0,
    total_heads: int | None = None,
) -> list[tuple[int, int, int, int]]:
    """(offset, head_start, head_step, count) for each set of local heads that share an offset in this pair.

    The local heads are the global heads first_head .. first_head + num_heads - 1 of total_heads (a head
    shard, as in head-parallel attention); offsets and groups follow the global head index.
    """
    total = num_heads if total_heads is None else total_heads
    if (
        semantics == "longnet"
    ):  # offset o: the local heads start, start + rate, ... with (first_head + start) % rate == o
        starts = range(min(rate, num_heads))  # not range(rate): a rate of 2**30 would loop that long
        return sorted(((first_head + start) % rate, start, rate, -(-(num_heads - start) // rate)) for start in starts)
    base, extra = divmod(total, num_pairs)
    group_start = pair * base + min(pair, extra)
    group_end = group_start + base + (1 if pair < extra else 0)
    lo, hi = max(group_start, first_head), min(group_end, first_head + num_heads)
    return [(pair % rate, lo - first_head, 1, hi - lo)] if hi > lo else []


def pair_blocks(
    pair: int,
    seq_len: int,
    num_heads: int,
    segment_length: int,
    rate: int,
    num_pairs: int,
    semantics: str,
    first_head: int = 0,
    total_heads: int | None = None,
) -> list[Block]:
    """Blocks of one (segment length, dilation) pair: the full segments, then the ragged tail."""
    w = min(segment_length, seq_len)
    full, tail = divmod(seq_len, w)
    blocks = []
    for offset, h0, step, count in head_sets(pair, rate, num_heads, num_pairs, semantics, first_head, total_heads):
        for start, nseg, length in ((0, full, w), (full * w, 1, tail)):
            if nseg > 0 and offset < length:
                blocks.append(Block(pair, start, nseg, length, offset, rate, h0, step, count))
    return blocks


def check_head_groups(semantics: str, num_heads: int, num_pairs: int) -> None:
    """head_groups semantics gives every pair its own heads: at least one head per pair."""
    if semantics == "head_groups" and num_heads < num_pairs:
        raise ValueError(
            f"head_groups semantics needs at least one head per pair: num_heads >= {num_pairs} pairs, got "
            f"{num_heads}; use more heads, fewer pairs, or semantics='longnet'"
        )


def build_blocks(
    seq_len: int, num_heads: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str
) -> list[Block]:
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    check_head_groups(semantics, num_heads, len(segs))
    blocks: list[Block] = []
    for i, (w, r) in enumerate(zip(segs, rates)):
        blocks.extend(pair_blocks(i, seq_len, num_heads, w, r, len(segs), semantics))
    return blocks


def coverage_mask(seq_len: int, num_heads: int, blocks: Sequence[Block]) -> torch.Tensor:
    """Bool (N, H): which (position, head) rows are kept by at least one pair."""
    mask = torch.zeros(seq_len * num_heads, dtype=torch.bool)
    for block in blocks:
        mask[block.flat_index(num_heads).flatten()] = True
    return mask.view(seq_len, num_heads)


def uncovered_fraction(
    seq_len: int, num_heads: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str
) -> float:
    """Share of (position, head) rows that no pair keeps; those rows output 0 (docs/semantics.md)."""
    blocks = build_blocks(seq_len, num_heads, segment_lengths, dilation_rates, semantics)
    return 1.0 - coverage_mask(seq_len, num_heads, blocks).float().mean().item()


def attended_pairs(batch: int, blocks: Sequence[Block], causal: bool) -> int:
    """P of the FLOP convention (docs/semantics.md): (query, key) pairs computed, over batch, heads and pairs."""
    return sum(b.pairs_attended(batch, causal) for b in blocks)
