"""layout="documents": packed documents (cu_seqlens) balanced across the ranks of a sequence-parallel module.

A document's work is its causal (query, key) pairs, n(n+1)/2 for n tokens, each pair counted on the rank that
holds its query. Documents whose work is above `spread` (default 0.1) of the mean work per rank are spread over
every rank as zigzag shards of their own (layout.py: the document padded at its end to padded_length(n, p,
segments, layout="zigzag"), cut into 2p chunks, rank a holding chunks a and 2p-1-a), and the module's ring or
all-gather runs on each of them with the zigzag shard rule (shards.py). The other documents stay whole, on one
rank each, longest first to the rank with the least work so far (LPT). The rank LPT last gave a document had the
least work then, so the busiest rank exceeds the mean by at most one whole document's work: max/mean <= 1 +
spread, plus the zigzag pieces' own imbalance: a chunk's worth, unless segment_lengths make the spread documents'
alignment padding (in their last chunks, held by ranks 0, 1, ...) large (benchmarks/RESULTS.md).

A rank's shard: its pieces of the spread documents in document order, then its whole documents in order, then
padding up to the longest shard, L rows. `positions` (p, L) is the permutation applied: the global position of
each row, -1 for padding (masked keys; its output rows are 0 and are dropped by gather_sequence).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..documents import Call, document_spans
from .layout import rank_positions
from .padding import padded_length
from .work import document_pairs_per_position, rank_work


def causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


@dataclass(frozen=True, eq=False)
class DocumentLayout:
    """Which positions each rank holds under layout="documents"; pass it as `layout` to shard_sequence,
    rank_shard, join_shards and gather_sequence."""

    positions: torch.Tensor  # (world, L) int64: the global position of each rank's rows, -1 for padding
    spread: tuple[tuple[int, int, int], ...]  # (start, end, padded length) of each spread document
    whole: tuple[tuple[tuple[int, int], ...], ...]  # per rank, (start, end) of its whole documents
    seq_len: int  # T, the end of cu_seqlens

    @property
    def world(self) -> int:
        return self.positions.shape[0]

    @property
    def shard_len(self) -> int:
        return self.positions.shape[1]

    def __str__(self) -> str:
        digest = hashlib.sha1(self.positions.numpy().tobytes()).hexdigest()[:12]
        return f"documents({self.world}x{self.shard_len}, {digest})"

    def padding(self, rank: int, batch: int = 1, device=None) -> torch.Tensor:
        """(batch, L) bool: True at rank `rank`'s padding rows."""
        return (self.positions[rank] < 0).to(device).expand(batch, -1)

    def rank_shard(self, x: torch.Tensor, rank: int, dim: int, key_padding_mask: torch.Tensor | None):
        """Rank `rank`'s rows of x (zeros at padding) and their key padding mask (None: no padding, no mask)."""
        if x.shape[dim] != self.seq_len:
            raise ValueError(
                f"x has {x.shape[dim]} positions at dim {dim}, the documents' layout {self.seq_len}: pass the whole "
                "packed sequence whose cu_seqlens built the layout"
            )
        held = self.positions[rank].to(x.device)
        rows = x.index_select(dim, held.clamp(min=0))
        pad = (held < 0).view(-1, *[1] * (x.dim() - dim - 1))
        shard = torch.where(pad, torch.zeros((), dtype=x.dtype, device=x.device), rows)
        mask = self.padding(rank, x.shape[0], x.device)
        if key_padding_mask is not None:
            mask = mask | key_padding_mask.index_select(1, held.clamp(min=0))
        elif not bool(mask.any()):
            mask = None
        return shard.contiguous(), mask if mask is None else mask.contiguous()

    def join(self, whole: torch.Tensor, seq_len: int, dim: int) -> torch.Tensor:
        """The sequence's first `seq_len` positions from every rank's shard concatenated in rank order."""
        if whole.shape[dim] != self.positions.numel():
            raise ValueError(
                f"the shards hold {whole.shape[dim]} rows, the documents' layout {self.positions.numel()} "
                f"({self.world} ranks x {self.shard_len}): pass every rank's shard of this layout, in rank order"
            )
        flat = self.positions.reshape(-1)
        order = torch.empty(self.seq_len, dtype=torch.int64)
        order[flat[flat >= 0]] = torch.nonzero(flat >= 0).squeeze(1)
        return whole.index_select(dim, order[:seq_len].to(whole.device))


def _piece(start: int, end: int, padded: int, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s positions of the spread document [start, end) (padded to `padded`): zigzag chunks."""
    held = rank_positions(rank, world, padded // world, "zigzag") + start
    return torch.where(held < end, held, -1)


def document_layout(
    cu_seqlens: torch.Tensor, world: int, segment_lengths: Sequence[int] | None = None, spread: float = 0.1
) -> DocumentLayout:
    """The documents' balanced layout over `world` ranks (module docstring); segment_lengths: the module's, which
    the spread documents' zigzag chunks must align with (as shard_sequence's). The same on every rank."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.numel() < 2:
        document_spans(cu_seqlens, 0)  # its error names the fix
    spans = document_spans(cu_seqlens, int(cu_seqlens[-1]))
    limit = spread * sum(causal_pairs(b - a) for a, b in spans) / world
    big = [(a, b) for a, b in spans if world > 1 and causal_pairs(b - a) > limit]
    spread_docs = tuple((a, b, padded_length(b - a, world, segment_lengths, layout="zigzag")) for a, b in big)
    pieces = [[_piece(a, b, padded, r, world) for a, b, padded in spread_docs] for r in range(world)]
    load = [sum(int(_work(p, a)) for p, (a, _, _) in zip(mine, spread_docs)) for mine in pieces]
    whole: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    rows = [sum(p.numel() for p in mine) for mine in pieces]
    for a, b in sorted((s for s in spans if s not in big), key=lambda s: s[0] - s[1]):  # longest first
        rank = min(range(world), key=lambda r: (load[r], rows[r]))
        whole[rank].append((a, b))
        load[rank] += causal_pairs(b - a)
        rows[rank] += b - a
    width = max(rows)
    held = []
    for rank in range(world):
        docs = sorted(whole[rank])
        parts = [*pieces[rank], *(torch.arange(a, b) for a, b in docs), torch.full((width - rows[rank],), -1)]
        held.append(torch.cat(parts).long())
        whole[rank] = docs
    total = int(cu_seqlens[-1])
    return DocumentLayout(torch.stack(held), spread_docs, tuple(tuple(w) for w in whole), total)


def _work(held: torch.Tensor, start: int) -> torch.Tensor:
    """Causal pairs of the real rows `held` of a document starting at `start`: the j-th row attends j + 1 keys."""
    real = held[held >= 0]
    return (real - start + 1).sum()


def rank_pairs(positions: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """(world,) int64: the causal pairs of each rank's rows (positions (world, L), -1 padding), each row attending
    its document's keys up to itself; any layout (contiguous shards: arange(p·L).view(p, L)). work.py counts them."""
    lengths = cu_seqlens.long().diff().tolist()
    return rank_work(document_pairs_per_position(lengths, None, None, 1, causal=True), positions)


def balanced_documents(local: Call, spread: Call, q, k, v, key_padding_mask, layout: DocumentLayout, rank: int):
    """(out, lse) of this rank's shard under `layout`: each spread document's piece through `spread` (the zigzag
    ring or all-gather: every rank calls it for the same documents in the same order), each whole document
    through `local`, padding rows 0 (lse -inf)."""
    mask = layout.padding(rank, q.shape[0], q.device)
    if key_padding_mask is not None:
        mask = mask | key_padding_mask
    outs, lses, at = [], [], 0
    for a, b, padded in layout.spread:
        rows = slice(at, at + padded // layout.world)
        masked = key_padding_mask is not None or padded > b - a  # the same on every rank
        out, lse = spread(q[:, rows], k[:, rows], v[:, rows], mask[:, rows] if masked else None)
        outs.append(out)
        lses.append(lse)
        at = rows.stop
    for a, b in layout.whole[rank]:
        rows = slice(at, at + b - a)
        out, lse = local(q[:, rows], k[:, rows], v[:, rows], None if key_padding_mask is None else mask[:, rows])
        outs.append(out)
        lses.append(lse)
        at = rows.stop
    if at < q.shape[1]:
        outs.append(q.new_zeros((q.shape[0], q.shape[1] - at, *q.shape[2:])))
        dtype = lses[0].dtype if lses else torch.float32
        lses.append(torch.full((q.shape[0], q.shape[1] - at, q.shape[2]), -torch.inf, dtype=dtype, device=q.device))
    return torch.cat(outs, 1), torch.cat(lses, 1)
