"""Packed variable-length documents, flash-attn's varlen convention: q, k, v of shape (1, T, H, D) hold the
documents one after another, `cu_seqlens` (int, docs + 1 entries: 0, end of document 1, ..., T) their
boundaries. Each document is attended on its own, its dilated segments (or block pattern) starting at its
first token, exactly as a separate call on it would: no (query, key) pair across documents is computed.

A document is one call of the single-device engine (`attend_documents`); the distributed forms gather the
rows of documents that cross shard boundaries (distributed/documents.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], tuple[torch.Tensor, torch.Tensor]]


def document_spans(cu_seqlens: torch.Tensor, total: int, batch: int = 1) -> list[tuple[int, int]]:
    """[(start, end)] of the non-empty documents; a ValueError naming the fix for a bad cu_seqlens."""
    if (
        not isinstance(cu_seqlens, torch.Tensor)
        or cu_seqlens.dim() != 1
        or cu_seqlens.is_floating_point()
        or cu_seqlens.dtype == torch.bool
        or cu_seqlens.numel() < 2
    ):
        raise ValueError(
            "cu_seqlens must be a 1-D integer tensor of documents + 1 cumulative lengths, e.g. "
            "torch.tensor([0, 7, 107], dtype=torch.int32) for documents of 7 and 100 tokens"
        )
    if batch != 1:
        raise ValueError(
            f"cu_seqlens packs documents along one sequence: pass q, k, v of shape (1, T, H, D), "
            f"got batch {batch} (concatenate the batch's documents into one row)"
        )
    bounds = [int(x) for x in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at the sequence length {total}, got {bounds[0]} ... {bounds[-1]}"
        )
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError("cu_seqlens must be non-decreasing (cumulative document lengths)")
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def whole_sequence(cu_seqlens: torch.Tensor | None, total: int) -> bool:
    """cu_seqlens describes one document over all `total` positions (or is None): the plain call is the same."""
    return cu_seqlens is None or (cu_seqlens.numel() == 2 and [int(x) for x in cu_seqlens.tolist()] == [0, total])


def offsets(lengths: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """cu_seqlens of documents of `lengths` tokens: int32 (0, l1, l1 + l2, ...)."""
    return torch.tensor([0, *itertools.accumulate(int(n) for n in lengths)], dtype=torch.int32, device=device)


def attend_documents(
    call: Call,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of `call(q, k, v, key_padding_mask)` on each document's rows, concatenated in order."""
    spans = document_spans(cu_seqlens, q.shape[1], q.shape[0])
    if spans == [(0, q.shape[1])]:
        return call(q, k, v, key_padding_mask)
    mask = lambda a, b: None if key_padding_mask is None else key_padding_mask[:, a:b]
    outs, lses = zip(*(call(q[:, a:b], k[:, a:b], v[:, a:b], mask(a, b)) for a, b in spans))
    return torch.cat(outs, 1), torch.cat(lses, 1)
