"""The chunks of the block-local references (reference_local.py): which query rows meet which keys, at which
heads, cut into parts of at most a budget of scores. One layout per definition: Dilated (docs/semantics.md),
Blocks (a block table) and Window (the token sliding window, docs/block-sparse.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .reference import pair_offsets

ALL = slice(None)  # every head of a chunk
MIN_PART_ROWS = 128  # rows a part keeps before its heads are split (see Budget)
Rows = slice | torch.Tensor  # positions: a stride, or 1-D int64 ascending


@dataclass(frozen=True)
class Chunk:
    """Query rows against the keys they may attend, at some heads, in parts that share the gathered keys."""

    keys: Rows  # key positions
    parts: list[tuple[Rows, int, slice]]  # query positions, how many of the keys they meet (a prefix), and
    # which of the chunk's heads
    heads: torch.Tensor | None = None  # the query heads (None: all)
    rule: object = None  # rule(rows, keys) -> bool (rows, keys) allowed among them (None: all)
    bias: torch.Tensor | None = None  # per key, added to its scores (the dilated pattern's log c; None: 0)


def _causal(rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return keys.view(1, -1) <= rows.view(-1, 1)


class Dilated:
    """docs/semantics.md: pair i keeps position t for head h when pi_i(t) mod r_i = o_i(h); a kept query attends
    the kept keys of its own segment (causal: u <= t); c_h(t, u) counts the pairs that allow (t, u), and the
    softmax weighs exp by c, as the dense reference does with an additive log c bias. Rows that the same pairs
    keep in the same segments (for heads with the same offsets) attend the same keys with the same counts: each
    such row class is one chunk, its rows against the union of their pairs' kept keys, scores biased by log c.
    A row's keys are then all in its one chunk (one softmax, the gradients in the forward pass where the
    upstream gradient is known), and a key two pairs share is scored once, not twice (21% fewer
    scores than one chunk per pair at segments 2048, 4096, 8192 with rates 1, 2, 4). Which pairs a head uses,
    with which offsets: reference.pair_offsets, the dense reference's own."""

    def __init__(self, n, heads, segs, rates, semantics, causal, budget, device):
        self.n, self.heads, self.causal, self.budget, self.device = n, heads, causal, budget, device
        groups: dict[tuple, list[int]] = {}  # the (w, r, offset) of each pair a head uses: the heads using them
        for h in range(heads):
            pairs = tuple((min(w, n), r, o) for w, r, o in pair_offsets(h, heads, segs, rates, semantics))
            groups.setdefault(pairs, []).append(h)
        self.groups = [
            (pairs, None if len(hs) == heads else torch.tensor(hs, device=device)) for pairs, hs in groups.items()
        ]

    def chunks(self) -> Iterator[Chunk]:
        for pairs, heads in self.groups:
            for rows, keys, counts in self._classes(pairs):
                yield self._chunk(rows, keys, counts, self.heads if heads is None else heads.numel(), heads)

    def _classes(self, pairs) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(rows, keys, c per key) of each row class: rows whose pairs keep them in the same segments."""
        t = torch.arange(self.n, device=self.device)
        # per pair, 1 + the segment that keeps t (0: not kept), folded into one class number per row, renumbered
        # after each pair so that it stays below N (no overflow however many pairs)
        code = torch.zeros_like(t)
        for w, r, o in pairs:
            digit = torch.where((t % w) % r == o, t // w + 1, 0)
            code = torch.unique(code * (self.n // w + 2) + digit, return_inverse=True)[1]
        order = torch.sort(code, stable=True).indices
        for rows in order.split(torch.bincount(code).tolist()):
            first = int(rows[0])  # every row of a class is kept by the same pairs in the same segments as this one
            kept = [
                torch.arange(first // w * w + o, min(self.n, first // w * w + w), r, device=self.device)
                for w, r, o in pairs
                if (first % w) % r == o
            ]
            if kept:
                keys, counts = torch.unique(torch.cat(kept), return_counts=True)
                yield rows, keys, counts

    def _chunk(self, rows, keys, counts, heads, head_index) -> Chunk:
        step, hs = self.budget.split(rows.numel(), keys.numel(), heads)
        # keys ascending: a causal part meets those up to its last row
        meets = lambda part: int(torch.searchsorted(keys, int(part[-1]) + 1)) if self.causal else keys.numel()
        parts = [
            (_stride_or_index(rows[r0 : r0 + step]), meets(rows[r0 : r0 + step]), h)
            for r0 in range(0, rows.numel(), step)
            for h in hs
        ]
        bias = None if bool((counts == 1).all()) else counts.to(torch.float64).log()
        return Chunk(_stride_or_index(keys), parts, head_index, _causal if self.causal else None, bias)


def _stride_or_index(positions: torch.Tensor) -> slice | torch.Tensor:
    """Ascending positions as a slice where they are evenly spaced (a view, no gather), else themselves."""
    if positions.numel() == 0:
        return positions
    if positions.numel() == 1:
        return slice(int(positions[0]), int(positions[0]) + 1)
    step = int(positions[1] - positions[0])
    if step > 0 and bool((positions.diff() == step).all()):
        return slice(int(positions[0]), int(positions[-1]) + 1, step)
    return positions


class Blocks:
    """docs/block-sparse.md: query t attends key u when table[t // b, u // b] (causal: and u <= t). A chunk is
    a set of query blocks against the union of their key blocks (masked where a block attends fewer), in parts
    of rows where its keys exceed the budget. The blocks of a chunk are those with the same table row (the keys
    are gathered once for all of them: a dilated table repeats each row every r blocks), or, where the keys
    are few, consecutive blocks up to the budget."""

    def __init__(self, n, table, block_size, causal, budget, device):
        self.n, self.b, self.causal, self.device = n, block_size, causal, device
        self.table, self.budget = table.to(device), budget
        widest = int(self.table.sum(dim=1).max().item()) * block_size if self.table.numel() else 1
        self.blocks = max(1, budget.rows(max(1, min(n, widest))) // block_size)

    def groups(self) -> list[torch.Tensor]:
        """The query blocks of each chunk, ascending: like rows together, then runs merged up to self.blocks."""
        if not self.table.numel():
            return []
        _, which = torch.unique(self.table, dim=0, return_inverse=True)
        groups, current = [], []
        for g in dict.fromkeys(which.tolist()):  # by first block
            blocks = (which == g).nonzero().flatten()
            if current and sum(map(len, current)) + len(blocks) > self.blocks:
                groups.append(torch.cat(current).sort().values)
                current = []
            current.append(blocks)
        return groups + ([torch.cat(current).sort().values] if current else [])

    def chunks(self) -> Iterator[Chunk]:
        offsets = torch.arange(self.b, device=self.device)
        for query_blocks in self.groups():
            rows = _positions(query_blocks, self.b, offsets, self.n)
            last = int(rows[-1]) + 1
            blocks = self.table[query_blocks].any(dim=0).nonzero().flatten()
            keys = _positions(blocks, self.b, offsets, last if self.causal else self.n)
            if not keys.numel():
                continue
            whole = not self.causal and bool(self.table[query_blocks][:, blocks].all())  # every row, every key
            step, hs = self.budget.split(rows.numel(), keys.numel(), self.budget.heads)
            parts = [(rows[r0 : r0 + step], h) for r0 in range(0, rows.numel(), step) for h in hs]
            # keys ascending: a causal part meets those up to its last row
            meets = lambda part: int(torch.searchsorted(keys, int(part[-1]) + 1)) if self.causal else keys.numel()
            parts = [(_stride_or_index(part), meets(part), h) for part, h in parts]
            yield Chunk(_stride_or_index(keys), parts, None, None if whole else self.allowed)

    def allowed(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        allowed = self.table[rows // self.b][:, keys // self.b]
        return allowed & _causal(rows, keys) if self.causal else allowed


def _positions(blocks: torch.Tensor, size: int, offsets: torch.Tensor, end: int) -> torch.Tensor:
    """The token positions of `blocks` (ascending) below `end`."""
    positions = (blocks.view(-1, 1) * size + offsets).flatten()
    return positions[positions < end]


class Window:
    """docs/block-sparse.md, sliding_window: query t attends keys t - left .. t + right (causal: .. t)."""

    def __init__(self, n, left, right, causal, budget):
        self.n, self.left = n, left
        self.reach = 0 if causal else right
        span = self.left + self.reach
        budget = budget.rows(1)  # rows x keys the chunk may hold: rows (rows + span) <= budget
        self.rows = max(1, min(n, int(((span * span + 4 * budget) ** 0.5 - span) / 2)))

    def chunks(self) -> Iterator[Chunk]:
        for t0 in range(0, self.n, self.rows):
            t1 = min(self.n, t0 + self.rows)
            keys = slice(max(0, t0 - self.left), min(self.n, t1 + self.reach))
            yield Chunk(keys, [(slice(t0, t1), keys.stop - keys.start, ALL)], None, self.allowed)

    def allowed(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        gap = keys.view(1, -1) - rows.view(-1, 1)
        return (gap >= -self.left) & (gap <= self.reach)


class Budget:
    """How a chunk's query rows and heads are cut into parts of at most `elements` scores (B x heads x rows x
    keys): all heads at once where that leaves MIN_PART_ROWS rows, else fewer heads at a time (few rows against
    many keys make thin matmuls and many small steps)."""

    def __init__(self, batch: int, heads: int, elements: int, whole_heads: bool = False):
        self.batch, self.heads, self.elements = batch, heads, elements
        self.whole_heads = whole_heads  # every head of a row in one part (a row-wise upstream gradient)

    def rows(self, keys: int, heads: int | None = None) -> int:
        return max(1, self.elements // max(1, self.batch * (self.heads if heads is None else heads) * keys))

    def split(self, rows: int, keys: int, heads: int) -> tuple[int, list[slice]]:
        """(rows per part, the head slices) of a chunk of `rows` rows, `keys` keys and `heads` heads."""
        if self.whole_heads or self.rows(keys, heads) >= min(rows, MIN_PART_ROWS) or heads == 1:
            return self.rows(keys, heads), [ALL]
        per = max(1, min(heads, self.elements // max(1, self.batch * keys * min(rows, MIN_PART_ROWS))))
        return self.rows(keys, per), [slice(h, min(heads, h + per)) for h in range(0, heads, per)]
