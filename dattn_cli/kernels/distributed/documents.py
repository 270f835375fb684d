"""Packed documents (kernels/documents.py) over sequence shards: rank s holds positions s·L ... s·L + L - 1 of
the packed sequence; `cu_seqlens` describes the whole sequence (T = p·L) and is the same on every rank.

A document inside a shard is one local call. The rows of documents that cross a shard boundary are
all-gathered (q, k, v, and the key mask; every rank's piece padded to the longest): each rank then attends
every crossing document it holds part of on the whole document, and keeps its own rows. That document is
computed by each rank holding part of it: exact (the all-gather's backward reduce-scatters the gradients
to the rows' owners), and cheap when documents are short against a shard; a document spanning many ranks
is computed on each of them (one document over the whole sequence takes the call without cu_seqlens: the
pattern's own sequence parallelism). Bytes: what the all-gather moves, counted in the module's comm_stats.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist

from ..documents import Call, document_spans
from .comm import CommStats, check_consistent, group_rank_size


class _GatherPieces(torch.autograd.Function):
    """all_gather of equal-size pieces, each returned as (world, *piece); backward: one reduce_scatter (sum) of
    all their gradients. One collective for q, k and v together, so that no rank's autograd order can pair
    its q with another rank's k."""

    @staticmethod
    def forward(ctx, group, stats: CommStats, *pieces: torch.Tensor):
        ctx.group, ctx.stats, ctx.shapes = group, stats, [p.shape for p in pieces]
        flat = torch.cat([p.reshape(-1) for p in pieces])
        gathered = _all_gather(flat, group, stats, "forward")
        sizes = [p.numel() for p in pieces]
        return tuple(part.reshape(-1, *shape) for part, shape in zip(gathered.split(sizes, dim=1), ctx.shapes))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        _, world = group_rank_size(ctx.group)
        flat = torch.cat([g.reshape(world, -1) for g in grads], dim=1).reshape(-1)
        mine = flat.new_empty(flat.numel() // world)
        dist.reduce_scatter_single(mine, flat, group=ctx.group)
        moved = (world - 1) * mine.numel() * mine.element_size()
        ctx.stats.add("backward", moved, moved)
        parts = mine.split([math.prod(shape) for shape in ctx.shapes])
        return (None, None, *(part.view(shape) for part, shape in zip(parts, ctx.shapes)))


def _all_gather(piece: torch.Tensor, group, stats: CommStats, phase: str) -> torch.Tensor:
    _, world = group_rank_size(group)
    piece = piece.contiguous()
    gathered = piece.new_empty((world, *piece.shape))
    dist.all_gather_single(gathered.view(-1), piece.view(-1), group=group)
    moved = (world - 1) * piece.numel() * piece.element_size()
    stats.add(phase, moved, moved)
    return gathered


def _crossing_pieces(spans: list[tuple[int, int]], shard: int, world: int) -> list[list[tuple[int, int]]]:
    """Per rank, the (start, end) global ranges of its rows that belong to documents crossing a shard boundary."""
    pieces: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    for a, b in spans:
        first, last = a // shard, (b - 1) // shard
        if first == last:
            continue
        for s in range(first, last + 1):
            pieces[s].append((max(a, s * shard), min(b, (s + 1) * shard)))
    return pieces


def check_documents(group, name: str, spans: list[tuple[int, int]], device: torch.device) -> None:
    """Every rank must pass the same documents: checked on every call (one small all_gather), and not remembered
    by the module (the boundaries change from batch to batch: a remembered set would only grow)."""
    digest = hashlib.sha1(str(spans).encode()).hexdigest()
    check_consistent(group, name, (len(spans),), torch.int64, f"documents {digest}", device)


def sharded_documents(
    call: Call,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    group,
    stats: CommStats,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of this rank's shard of the packed documents (every rank's cu_seqlens checked the same; the
    module's call counted); `call` attends one whole document locally."""
    rank, world = group_rank_size(group)
    shard = q.shape[1]
    spans = document_spans(cu_seqlens, shard * world, q.shape[0])
    check_documents(group, name, spans, q.device)
    stats.call()
    pieces = _crossing_pieces(spans, shard, world)
    base = rank * shard
    local_rows = lambda a, b: slice(a - base, b - base)  # noqa: E731
    width = max(sum(b - a for a, b in p) for p in pieces)
    gathered = None
    if width:

        def piece(x):
            rows = [x[:, :0]] + [x[:, local_rows(a, b)] for a, b in pieces[rank]]  # x[:, :0]: in x's graph even empty
            pad = x.new_zeros((x.shape[0], width - sum(r.shape[1] for r in rows), *x.shape[2:]))
            return torch.cat([*rows, pad], 1)

        gathered = _GatherPieces.apply(group, stats, piece(q), piece(k), piece(v))
        if key_padding_mask is not None:
            gathered_mask = _all_gather(piece(key_padding_mask.to(torch.uint8)), group, stats, "forward").bool()
    outs, lses, used = [], [], False
    for a, b in spans:
        if b <= base or a >= base + shard:
            continue
        if a >= base and b <= base + shard:  # inside this shard
            rows = local_rows(a, b)
            out, lse = call(
                q[:, rows], k[:, rows], v[:, rows], None if key_padding_mask is None else key_padding_mask[:, rows]
            )
        else:
            whole = [_document_rows(g, pieces, a, b) for g in gathered]
            mask = None if key_padding_mask is None else _document_rows(gathered_mask, pieces, a, b)
            out, lse = call(*whole, mask)
            keep = slice(max(a, base) - a, min(b, base + shard) - a)
            out, lse, used = out[:, keep], lse[:, keep], True
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs, 1), torch.cat(lses, 1)
    if gathered is not None and not used and torch.is_grad_enabled():
        # every rank must enter the gather's backward (a reduce-scatter): tie it to this rank's output
        out = out + sum(g.reshape(-1)[:0].sum() for g in gathered)  # an empty sum: exactly 0, still in the graph
    return out, lse


def _document_rows(gathered: torch.Tensor, pieces: list[list[tuple[int, int]]], a: int, b: int) -> torch.Tensor:
    """Document [a, b)'s rows from the gathered pieces (world, B, width, ...), in order."""
    parts = []
    for s, ranges in enumerate(pieces):
        at = 0
        for lo, hi in ranges:
            if lo >= a and hi <= b:
                parts.append(gathered[s][:, at : at + hi - lo])
            at += hi - lo
    return torch.cat(parts, 1)
