"""Any N over any p ranks: the sequence padded at the end to N' = p·L, each rank's shard of L positions
with the key padding mask of its positions, and the whole sequence gathered back without the padding.

The distributed modules take equal shards, and the sequence-parallel ones (ring, all-gather) need every
segment length ŵ = min(w, N') to divide L or be a multiple of it; the block-sparse ring needs L to be a
multiple of block_size. `padded_length` picks the smallest N' = p·L with L >= ceil(N/p) that satisfies
those, and padding at the end keeps the result exact (docs/communication.md, "Any N, any p"). Under the
zigzag layout (layout.py) the same holds of the chunks C = L/2, and a segment spanning chunks must also
divide N' (whole groups of chunks, so each group and its mirror image lie on the same ranks):

* segments start at multiples of w and every real position is < N. If w < N the real positions' segments,
  in-segment indices and kept rows are those of the unpadded sequence; if w >= N the first segment holds
  every real position, padded or not, at the same in-segment indices;
* the padded keys are masked (True = ignore, the modules' `key_padding_mask` convention), so they take
  part in no softmax; padded queries give rows that are cut off again (`gather_sequence`, `join_shards`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..validation import check_key_padding_mask
from .comm import check_consistent, group_rank_size
from .document_layout import DocumentLayout
from .layout import check_layout, chunks_per_rank, rank_positions, sequence_order
from .padding import _positive, padded_length

__all__ = ["gather_sequence", "join_shards", "padded_length", "padding_mask", "rank_shard", "shard_sequence"]


def padding_mask(
    batch: int, seq_len: int, rank: int, length: int, device=None, *, world: int = 1, layout: str = "contiguous"
) -> torch.Tensor:
    """(batch, length) bool of rank `rank`'s shard: True at the padded positions (>= seq_len). world is needed
    by the zigzag layout only (its chunks depend on it)."""
    if layout == "contiguous":
        positions = torch.arange(rank * length, (rank + 1) * length, device=device)
    else:
        positions = rank_positions(rank, world, length, layout, device)
    return (positions >= seq_len).expand(batch, length)


def _sequence_dim(x, dim: int) -> int:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x has shape {shape}: pass a tensor (batch, seq_len, ...) with the sequence at dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim={dim!r} is not a dimension of x with shape {tuple(x.shape)}: pass the sequence "
            "dimension (1 for (batch, seq_len, ...))"
        )
    dim %= x.dim()
    if dim == 0:
        raise ValueError(
            f"dim=0 is the batch dimension of x with shape {tuple(x.shape)}: put the batch first and "
            "pass the sequence dimension (dim >= 1)"
        )
    return dim


def _piece(x: torch.Tensor, start: int, size: int, dim: int, fill) -> torch.Tensor:
    """Positions start .. start + size - 1 of x along dim, past its end filled with `fill`."""
    start = min(start, x.shape[dim])
    real = min(start + size, x.shape[dim]) - start
    piece = x.narrow(dim, start, real)
    if real < size:
        pad = list(x.shape)
        pad[dim] = size - real
        piece = torch.cat([piece, torch.full(pad, fill, dtype=x.dtype, device=x.device)], dim=dim)
    return piece


def rank_shard(
    x: torch.Tensor,
    rank: int,
    world: int,
    length: int,
    *,
    dim: int = 1,
    key_padding_mask: torch.Tensor | None = None,
    layout: str = "contiguous",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank `rank`'s `length` positions (layout.py) of x padded with zeros at the end to world·length, and the
    key padding mask of those positions (True = ignore): the user's `key_padding_mask` (batch, N), if any,
    with the padding added; None when nothing is padded and no mask is given (the same on every rank).
    Differentiable in x. layout: a name, or a DocumentLayout (document_layout.py; length: its shard_len)."""
    dim = _sequence_dim(x, dim)
    if isinstance(layout, DocumentLayout):
        return layout.rank_shard(x, rank, dim, key_padding_mask)
    seq_len = x.shape[dim]
    _positive("length", length, "use padded_length(N, world, ...) // world")
    check_layout(layout)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank={rank!r} is not a rank of {world}: pass 0 .. {world - 1}")
    if world * length < seq_len:
        raise ValueError(
            f"length={length}: {world} shards of {length} hold fewer than the N={seq_len} positions of "
            f"x; use padded_length(N, world, ...) // world"
        )
    check_key_padding_mask(key_padding_mask, x.shape[0], seq_len, x.device)
    starts = rank_positions(rank, world, length, layout)
    size = length // chunks_per_rank(world, layout)
    starts = starts[::size].tolist()
    shard = torch.cat([_piece(x, s, size, dim, 0) for s in starts], dim=dim)
    if key_padding_mask is not None:
        mask = torch.cat([_piece(key_padding_mask, s, size, 1, True) for s in starts], dim=1)
    elif world * length > seq_len:
        mask = padding_mask(x.shape[0], seq_len, rank, length, x.device, world=world, layout=layout)
    else:
        mask = None
    return shard.contiguous(), mask if mask is None else mask.contiguous()


def shard_sequence(
    x: torch.Tensor,
    group=None,
    *,
    segment_lengths: Sequence[int] | None = None,
    block_size: int | None = None,
    dim: int = 1,
    key_padding_mask: torch.Tensor | None = None,
    layout: str = "contiguous",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's shard of the whole sequence x, for a distributed module over `group` (default: the world),
    and the key padding mask of its positions to pass the module as `key_padding_mask`.

    segment_lengths: a ring or all-gather module's (shards must align with its segments); block_size: a
    block-sparse module's. The sequence is padded at the end to padded_length(N, p, ...) = p·L; the mask marks
    the padding (and `key_padding_mask`'s own True entries, a bool (batch, N) of the whole sequence). It is
    None when nothing is padded and no mask is given. layout: the module's (layout.py; "zigzag": chunks a and
    2p-1-a of 2p), or packed documents balanced: a DocumentLayout, document_layout(cu_seqlens, p, segment_lengths)
    for a module of layout="documents", whose `positions` is the permutation applied. Gather the outputs with
    gather_sequence(out, N, group, layout=layout)."""
    rank, world = group_rank_size(group)
    dim = _sequence_dim(x, dim)
    if isinstance(layout, DocumentLayout):
        if layout.world != world:
            raise ValueError(f"the documents' layout is for {layout.world} ranks, the group has {world}: rebuild it")
        return layout.rank_shard(x, rank, dim, key_padding_mask)
    check_layout(layout)
    length = padded_length(x.shape[dim], world, segment_lengths, block_size, layout) // world
    return rank_shard(x, rank, world, length, dim=dim, key_padding_mask=key_padding_mask, layout=layout)


def join_shards(shards: Sequence[torch.Tensor], seq_len: int, dim: int = 1, layout: str = "contiguous") -> torch.Tensor:
    """The ranks' shards, in rank order, as the whole sequence of `seq_len` positions (the padding cut off)."""
    if not shards:
        raise ValueError("shards is empty: pass every rank's shard, in rank order")
    dim = _sequence_dim(shards[0], dim)
    if isinstance(layout, DocumentLayout):
        return layout.join(torch.cat(list(shards), dim=dim), seq_len, dim)
    check_layout(layout)
    total = sum(s.shape[dim] for s in shards)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= total:
        raise ValueError(
            f"seq_len={seq_len!r} is not within the {total} positions of the {len(shards)} shards: pass "
            "the length before padding (the sequence length given to shard_sequence)"
        )
    whole = torch.cat(list(shards), dim=dim)
    if chunks_per_rank(len(shards), layout) > 1:
        order = sequence_order(len(shards), shards[0].shape[dim], layout)[:seq_len].to(whole.device)
        return whole.index_select(dim, order)
    return whole.narrow(dim, 0, seq_len)


def gather_sequence(
    shard: torch.Tensor, seq_len: int, group=None, dim: int = 1, *, layout: str = "contiguous"
) -> torch.Tensor:
    """The whole sequence from every rank's shard (all-gathered over `group`, default the world), without
    the padding shard_sequence added: `seq_len` is the length before padding; `layout` the one shard_sequence
    used. Every rank gets it. Not differentiable: train on the shards (each rank's loss on its own positions)."""
    _, world = group_rank_size(group)
    dim = _sequence_dim(shard, dim)
    if not isinstance(layout, DocumentLayout):
        check_layout(layout)
    _positive("seq_len", seq_len, "pass the length before padding (the sequence length given to shard_sequence)")
    if world == 1:
        return join_shards([shard.detach()], seq_len, dim, layout)
    # shards of different shapes would leave all_gather waiting or mixing data: one small check first
    config = f"{dim}|{seq_len}|{layout}"
    check_consistent(group, "gather_sequence", tuple(shard.shape), shard.dtype, config, shard.device)
    shard = shard.detach().contiguous()
    parts = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(parts, shard, group=group)
    return join_shards(parts, seq_len, dim, layout)
