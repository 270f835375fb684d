"""The one shard and byte model of the sequence-parallel strategies (ring, all-gather): which pairs span
several ranks, what each rank packs, and the bytes each rank moves. The kernels run it, `comm_volume`
evaluates it, and workload/counts.py and plan/memory.py call it (docs/communication.md).

Each of p ranks holds a contiguous shard of L = N/p positions. For pair i (ŵ = min(w, N)):

* L divisible by ŵ: every segment lies inside one shard; the pair's blocks run locally, no bytes move.
* ŵ divisible by L: a segment spans g = ŵ/L consecutive ranks (the last group is smaller when N is
  not a multiple of ŵ). Rank s holds in-segment indices (s mod g)·L ... + L - 1, so for a head set with
  offset o its kept rows start at local index u₀ = (o - (s mod g)·L) mod r, stride r. The block of its
  own kept rows runs locally (causal if the call is); the blocks against the other group members'
  kept rows need their sparsified K/V: that is what the ring rotates and the all-gather gathers.

Other shard lengths would split a segment unevenly over ranks; they are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from ..heads import KVHeadSet, kv_group
from ..pattern import Block, head_sets, pair_blocks, validate_pattern
from .exchange import pack_rows, packed_elements, unpack_rows


def ranks_per_segment(segment: int, seq_len: int, world: int, name: str, pair: int = 0) -> int:
    """The span rule: g, the ranks one segment of ŵ = min(segment, seq_len) positions spans over `world`
    shards of L = seq_len // world; 1 when ŵ divides L (the pair runs locally). Refused otherwise."""
    span, shard = min(segment, seq_len), seq_len // world
    if shard % span == 0:
        return 1
    if span % shard:
        raise ValueError(
            f"{name}: segment length {span} (pair {pair}) neither divides nor is a multiple of the shard length "
            f"{shard} = N/p = {seq_len}/{world}: use segment lengths that are divisors or multiples of "
            "N/p, or pad the sequence with shard_sequence(x, group, segment_lengths=...) (distributed/sharding.py)"
        )
    return span // shard


@dataclass(frozen=True)
class SpanningPair:
    """A pair whose segment spans `len(group)` ranks; this rank is group member `index`."""

    pair: int
    rate: int
    shard_len: int
    group: tuple[int, ...]  # ranks of the process group that share this rank's segment
    index: int
    ranks_per_segment: int  # g = ŵ / L; the last group is smaller when N is not a multiple of ŵ
    sets: tuple[tuple[int, int, int, int], ...]  # (offset, head_start, head_step, heads) per head set
    kv_group: int = 1  # query heads per kv head (GQA): K/V travel at the kv heads (heads.py)
    first_set: int = 0  # this pair's first head set among all spanning pairs' (dropout streams)

    @cached_property
    def kv_sets(self) -> tuple[KVHeadSet, ...]:
        """Per head set, its kv heads: what is packed, and how the receiver repeats them."""
        return tuple(KVHeadSet(h0, step, count, self.kv_group) for _, h0, step, count in self.sets)

    @cached_property
    def kv_heads(self) -> int:
        """H_i: the K/V heads one kept row carries, summed over the head sets."""
        return sum(kv.kv_count for kv in self.kv_sets)

    def blocks(self, member: int) -> list[Block | None]:
        """Per head set, the kept rows of group member `member` in its own shard (None: no kept row)."""
        result = []
        for offset, h0, step, count in self.sets:
            u0 = (offset - member * self.shard_len) % self.rate
            result.append(
                Block(self.pair, 0, 1, self.shard_len, u0, self.rate, h0, step, count) if u0 < self.shard_len else None
            )
        return result

    def _sizes(self, member: int, batch: int, head_dim: int, with_mask: bool) -> list[int]:
        """Per head set holding member rows, the elements of its packed K and V (and mask) rows."""
        return [
            packed_elements(batch, kv.kv_count, head_dim, block.rows, with_mask)
            for block, kv in zip(self.blocks(member), self.kv_sets)
            if block is not None
        ]

    def elements(self, member: int, batch: int, head_dim: int, with_mask: bool) -> int:
        """Elements of member's packed K and V (and mask) rows."""
        return sum(self._sizes(member, batch, head_dim, with_mask))

    def pack(self, k: torch.Tensor, v: torch.Tensor, key_pad: torch.Tensor | None) -> torch.Tensor:
        """This rank's kept K/V rows of every head set in one flat buffer, each head set laid out as the
        backends want it, (B, kv heads, rows, D), followed by its key mask rows, if any (exchange.py)."""
        parts = [
            pack_rows(
                *(kv.pack(block.view(x).flatten(0, 1), dim=2).transpose(1, 2) for x in (k, v)),
                None if key_pad is None else key_pad[:, block.offset :: block.rate],
            )
            for block, kv in zip(self.blocks(self.index), self.kv_sets)
            if block is not None
        ]
        return torch.cat(parts) if parts else k.new_empty(0)

    @staticmethod
    def pack_grads(parts: list[tuple[torch.Tensor, torch.Tensor] | None], like: torch.Tensor) -> torch.Tensor:
        """dK, dV shares for a member's rows (per head set, (B, kv heads, rows, D)) in its pack layout."""
        flat = [pack_rows(*pair) for pair in parts if pair is not None]
        return torch.cat(flat) if flat else like.new_empty(0)

    def unpack(self, member: int, buffer: torch.Tensor, batch: int, head_dim: int, with_mask: bool):
        """Per head set: (k, v, key_pad) of member's rows, or None where it keeps no row; k and v repeated
        from the kv heads to the set's query heads."""
        pieces = iter(buffer.split(self._sizes(member, batch, head_dim, with_mask)))
        result = []
        for block, kv in zip(self.blocks(member), self.kv_sets):
            if block is None:
                result.append(None)
                continue
            mask = (batch, block.rows) if with_mask else None
            k, v, pad = unpack_rows(next(pieces), (batch, kv.kv_count, block.rows, head_dim), mask)
            result.append((kv.unpack(k, dim=1), kv.unpack(v, dim=1), pad))
        return result

    def unpack_grads(self, buffer: torch.Tensor, batch: int, head_dim: int):
        """Per head set of this rank's own rows: (dk, dv) as (B, kv heads, rows, D), or None."""
        pieces = iter(buffer.split(self._sizes(self.index, batch, head_dim, False)))
        return [
            None if block is None else unpack_rows(next(pieces), (batch, kv.kv_count, block.rows, head_dim))[:2]
            for block, kv in zip(self.blocks(self.index), self.kv_sets)
        ]


def shard_plan(
    seq_len: int,
    world: int,
    rank: int,
    num_heads: int,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    semantics: str,
    name: str,
    kv_group: int = 1,
) -> tuple[list[Block], list[SpanningPair]]:
    """Local blocks (pairs inside the shard, and each spanning pair's own-rows block) and spanning pairs."""
    shard = seq_len // world
    local: list[Block] = []
    spanning: list[SpanningPair] = []
    first_set = 0
    for pair, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        size = ranks_per_segment(w, seq_len, world, name, pair)
        if size == 1:
            local.extend(pair_blocks(pair, shard, num_heads, min(w, seq_len), r, len(segment_lengths), semantics))
            continue
        first = rank - rank % size
        group = tuple(range(first, min(first + size, world)))
        sets = tuple(head_sets(pair, r, num_heads, len(segment_lengths), semantics))
        plan = SpanningPair(pair, r, shard, group, rank - first, size, sets, kv_group, first_set)
        first_set += len(sets)
        local.extend(b for b in plan.blocks(plan.index) if b is not None)
        spanning.append(plan)  # also when its group is this rank alone (a short last segment): no bytes then
    return local, spanning


# Ring schedule: at step t (1 .. g-1) member a computes on the rows of member (a - t) mod g, which it
# received at step t from a - 1. Causal: only earlier members' rows matter, so nothing wraps around.
def ring_computes(a: int, t: int, g: int, causal: bool) -> bool:
    return not causal or a - t >= 0


def ring_receives(a: int, t: int, g: int, causal: bool) -> bool:
    return ring_computes(a, t, g, causal)


def ring_sends(a: int, t: int, g: int, causal: bool) -> bool:
    return ring_receives((a + 1) % g, t, g, causal)


def pair_traffic(
    strategy: str, sizes: Sequence[int], grad_sizes: Sequence[int], member: int, causal: bool
) -> tuple[int, int, int, int]:
    """The byte rule of one spanning pair: (forward sent, forward received, backward sent, backward received)
    of group member `member`, where member j packs sizes[j] bytes of K/V (and mask) rows and its dK/dV
    shares take grad_sizes[j]. Ring: non-causal, g-1 buffers each way forward; backward the rotation
    again plus the dK/dV shares sent home; causal sends only what a later member uses. All-gather: g-1
    copies of the largest buffer each way forward, the reduce-scatter of the shares (padded alike) backward."""
    g, a = len(sizes), member
    if g == 1:
        return 0, 0, 0, 0
    if strategy == "allgather":
        forward, backward = (g - 1) * max(sizes), (g - 1) * max(grad_sizes)
        return forward, forward, backward, backward
    steps = range(1, g)
    sent = sum(sizes[(a - t + 1) % g] for t in steps if ring_sends(a, t, g, causal))
    received = sum(sizes[(a - t) % g] for t in steps if ring_receives(a, t, g, causal))
    home_sent = sum(grad_sizes[(a - t) % g] for t in steps if ring_computes(a, t, g, causal))
    home_received = sum(grad_sizes[a] for t in steps if ring_computes((a + t) % g, t, g, causal))
    return sent, received, sent + home_sent, received + home_received


TRAFFIC_KEYS = ("forward_bytes_sent", "forward_bytes_received", "backward_bytes_sent", "backward_bytes_received")


def comm_volume(
    strategy: str,
    seq_len: int,
    world: int,
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
) -> list[dict[str, int]]:
    """Closed-form bytes per rank (docs/communication.md) for strategy 'ring' or 'allgather': `pair_traffic`
    over the shard plan's kept-row counts, without running anything. num_kv_heads (GQA): K/V and their
    shares travel at the kv heads of each head set."""
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    group = kv_group(num_heads, num_heads if num_kv_heads is None else num_kv_heads)
    counts = []
    for rank in range(world):
        totals = [0, 0, 0, 0]
        _, spanning = shard_plan(seq_len, world, rank, num_heads, segs, rates, semantics, strategy, group)
        for plan in spanning:
            members = range(len(plan.group))
            size = [plan.elements(j, batch, head_dim, with_mask) * element_bytes for j in members]
            grad = [plan.elements(j, batch, head_dim, False) * element_bytes for j in members]
            totals = [t + x for t, x in zip(totals, pair_traffic(strategy, size, grad, plan.index, is_causal))]
        counts.append(dict(zip(TRAFFIC_KEYS, totals)))
    return counts
