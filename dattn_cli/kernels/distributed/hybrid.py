"""Hybrid (2D) dilated attention: head parallelism inside blocks of h ranks, a ring across the p/h blocks.

The p ranks of the hybrid form blocks of h consecutive ranks ("h x ring", e.g. 2x4: h = 2, a ring of 4).
Each rank holds a sequence shard (B, L, H, D) in the usual layout over p ranks (contiguous, or zigzag:
chunks a and 2p-1-a of 2p). Inside a block, an all-to-all on its `head_group` (as head_parallel.py) turns
the h shards into the block's sequence piece at H/h heads; block b's piece is the ring shard b of a ring over
p/h members (contiguous: positions [b·hL, (b+1)·hL); zigzag: ring chunks b and 2R-1-b, after a local
reordering of the received rows). Ranks with the same place j in their blocks form a `ring_group` and run
RingDilatedAttention on their piece, at global heads j·H/h .. (j+1)·H/h - 1; a second all-to-all brings the
output back to sequence shards.

Bytes per rank (docs/communication.md): the head group's all-to-alls (head_parallel.py's formula with p = h on
shards of L) plus the ring's (`comm_volume("ring", ...)` over p/h members at H/h heads of head shard j).

The module never creates a process group: `hybrid_groups`, called on every rank of the job, makes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .comm import DistributedAttention, check_consistent, group_rank_size
from .head_parallel import _AllToAll, _exchange, spread_kv_heads
from .layout import check_layout
from .ring import RingDilatedAttention
from .shards import TRAFFIC_KEYS, comm_volume

HELPER = "hybrid_groups(group, head_parallel_size)"


def hybrid_groups(group=None, head_parallel_size: int = 2):
    """(head_group, ring_group) of this rank for a hybrid over `group` (None: every rank of the job; or a list
    of global ranks, for several hybrids side by side). Every rank of the job calls it, in the same order
    (dist.new_group is collective over the job); a rank outside `group` gets (None, None)."""
    ranks = list(range(dist.get_world_size())) if group is None else group
    if not isinstance(ranks, (list, tuple, range)):
        ranks = dist.get_process_group_ranks(ranks)
    ranks, h = list(ranks), head_parallel_size
    check_sizes(len(ranks), h)
    heads = [dist.new_group(ranks[b : b + h]) for b in range(0, len(ranks), h)]
    rings = [dist.new_group(ranks[j::h]) for j in range(h)]
    me = dist.get_rank()
    if me not in ranks:
        return None, None
    place = ranks.index(me)
    return heads[place // h], rings[place % h]


def head_parallel_size(heads: int, world: int, h: int | None = None) -> int:
    """h of a hybrid over `world` ranks: the given one, else 2 where it splits the ranks and heads, else 1."""
    if h is not None:
        return h
    return 2 if world % 2 == 0 and heads % 2 == 0 else 1


def check_sizes(world: int, h: int, heads: int | None = None) -> None:
    """The one line refusing an impossible h x ring layout of `world` ranks (and `heads` heads)."""
    if isinstance(h, bool) or not isinstance(h, int) or h < 1 or world % h:
        raise ValueError(
            f"head_parallel_size={h!r} must divide the {world} ranks of the hybrid: use one of "
            f"{[d for d in range(1, world + 1) if world % d == 0]}"
        )
    if heads is not None and heads % h:
        raise ValueError(f"{heads} heads cannot be split over head_parallel_size={h}: use an h dividing the heads")


def zigzag_order(h: int, length: int, device=None) -> torch.Tensor:
    """Rows of a block's all-to-all (h shards of `length` rows, each chunk a then chunk 2p-1-a) in ring order:
    the early chunks in order, then the late ones in order (the ring's zigzag chunks b and 2R-1-b)."""
    c = length // 2
    rows = torch.arange(h * length, device=device).view(h, 2, c)
    return torch.cat([rows[:, 0].reshape(-1), rows.flip(0)[:, 1].reshape(-1)])


class HybridDilatedAttention(DistributedAttention):
    """Sequence shards in, out; heads by all-to-all inside blocks of h ranks, a ring over the blocks."""

    def __init__(
        self,
        segment_lengths,
        dilation_rates,
        *,
        head_group=None,
        ring_group=None,
        layout: str = "contiguous",
        **attention_kwargs,
    ):
        if (head_group is None or ring_group is None) and dist.is_available() and dist.is_initialized():
            raise ValueError(f"HybridDilatedAttention needs head_group= and ring_group=: make them with {HELPER}")
        super().__init__(segment_lengths, dilation_rates, process_group=head_group, **attention_kwargs)
        self.layout = check_layout(layout)
        self.ring = RingDilatedAttention(
            segment_lengths, dilation_rates, process_group=ring_group, layout=layout, **attention_kwargs
        )
        self.ring.attention = self.attention
        self.ring.stats = self.stats  # one count of every byte this rank moves
        self.ring.head_shard = group_rank_size(head_group)  # (j, h): the ring works on head shard j of h

    @property
    def ring_group(self):
        return self.ring.process_group

    def rank_world(self) -> tuple[int, int]:
        (j, h), (b, ring) = group_rank_size(self.process_group), group_rank_size(self.ring_group)
        return b * h + j, h * ring

    def signature(self) -> str:
        return f"{super().signature()}|{self.layout}"

    def _distributed(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse, rank, world):
        _, length, heads, _ = q.shape
        _, h = group_rank_size(self.process_group)
        check_sizes(world, h, heads)
        k, v = spread_kv_heads(k, v, heads, h)
        config = (
            f"{self.signature()}|{bool(is_causal)}|{k.shape[2]}|{key_padding_mask is not None}|{cu_seqlens is not None}"
        )
        check_consistent(self.process_group, type(self).__name__, tuple(q.shape), q.dtype, config, q.device, owner=self)
        if group_rank_size(self.ring_group)[1] == 1:  # else the ring counts the call
            self.stats.call()
        group, stats = self.process_group, self.stats
        xs = [_AllToAll.apply(x, True, group, stats) for x in (q, k, v)]
        mask = self._block_mask(key_padding_mask, h)
        order = zigzag_order(h, length, q.device) if self.layout == "zigzag" and h > 1 else None
        if order is not None:
            xs = [x.index_select(1, order) for x in xs]
            mask = None if mask is None else mask.index_select(1, order)
        # cu_seqlens: the ring's packed documents over the blocks' pieces (contiguous layout only, as the ring)
        out, lse = self.ring.forward_with_lse(
            *xs, is_causal, key_padding_mask=mask, cu_seqlens=cu_seqlens, need_lse=need_lse
        )
        if order is not None:
            back = torch.argsort(order)
            out = out.index_select(1, back)
            lse = None if lse is None else lse.index_select(1, back)
        out = _AllToAll.apply(out.contiguous(), False, group, stats)
        if need_lse:
            lse = _exchange(lse.unsqueeze(-1).contiguous(), False, group, stats, "forward").squeeze(-1)
        return out, lse if need_lse else None

    def _block_mask(self, key_padding_mask, h: int):
        """The key mask of the block's whole piece (B, h·L): an all-gather on the head group, counted."""
        if key_padding_mask is None or h == 1:
            return key_padding_mask
        parts = [torch.empty_like(key_padding_mask) for _ in range(h)]
        dist.all_gather(parts, key_padding_mask.contiguous(), group=self.process_group)
        size = key_padding_mask.numel() * key_padding_mask.element_size() * (h - 1)
        self.stats.add("forward", size, size)
        return torch.cat(parts, dim=1)

    def describe(self) -> str:
        rank, world = self.rank_world()
        h = group_rank_size(self.process_group)[1]
        zigzag = ", zigzag shards" if self.layout == "zigzag" else ""
        return (
            f"HybridDilatedAttention {h}x{world // h} over {world} rank(s){zigzag} (all-to-all seq<->heads in "
            "blocks of h ranks, sparsified K/V rotated around the blocks); inner: " + self.attention.describe()
        )


def hybrid_comm_volume(
    seq_len: int,
    world: int,
    head_parallel_size: int,
    batch: int,
    num_heads: int,
    head_dim: int,
    element_bytes: int,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    semantics: str = "longnet",
    is_causal: bool = False,
    with_mask: bool = False,
    num_kv_heads: int | None = None,
    layout: str = "contiguous",
    with_lse: bool = False,
) -> list[dict[str, int]]:
    """Closed-form bytes per rank (rank b·h + j) of HybridDilatedAttention: the head group's all-to-alls (q and
    out at H heads, k and v at lcm(H_kv, h), each (h-1)/h of a shard of L = N/p; lse and the mask's all-gather
    when given) plus ring member b's bytes of comm_volume("ring") over p/h ranks at H/h heads of head shard j."""
    h, ring = head_parallel_size, world // head_parallel_size
    check_sizes(world, h, num_heads)
    kv = num_heads if num_kv_heads is None else num_kv_heads
    spread = math.lcm(kv, h)
    shard = seq_len // world
    per_head = batch * shard * head_dim * element_bytes * (h - 1) // h
    a2a = (2 * num_heads + 2 * spread) * per_head
    extra = (batch * shard * num_heads * 4 * (h - 1) // h if with_lse else 0) + (
        batch * shard * (h - 1) if with_mask and h > 1 else 0
    )
    zero = dict.fromkeys(TRAFFIC_KEYS, 0)
    counts = [[zero] * ring for _ in range(h)]
    for j in range(h if ring > 1 else 0):
        rings = comm_volume(
            "ring", seq_len, ring, batch, num_heads // h, head_dim, element_bytes, segment_lengths, dilation_rates,
            semantics, is_causal, with_mask, spread // h, layout, (j * num_heads // h, num_heads),
        )  # fmt: skip
        counts[j] = rings
    result = []
    for rank in range(world):
        b, j = divmod(rank, h)
        own = counts[j][b]
        forward = {key: own[key] + a2a + extra for key in TRAFFIC_KEYS[:2]}
        backward = {key: own[key] + a2a for key in TRAFFIC_KEYS[2:]}
        result.append({**forward, **backward})
    return result
