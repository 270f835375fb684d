"""The one shard and byte model of the sequence-parallel strategies (ring, all-gather): which pairs span
several ranks, what each rank packs, and the bytes each rank moves. The kernels run it, `comm_volume`
evaluates it, and workload/counts.py and plan/memory.py call it (docs/communication.md).

The padded sequence is cut into chunks of C positions (layout.py): contiguous shards, one chunk of
C = L = N/p per rank; zigzag, 2p chunks of C = L/2, rank a holding chunks a and 2p-1-a. For pair i
(ŵ = min(w, N)):

* C divisible by ŵ: every segment lies inside one chunk; the pair's blocks run locally, no bytes move.
* ŵ divisible by C: a segment spans g = ŵ/C consecutive chunks (contiguous: the last group is smaller when
  N is not a multiple of ŵ; zigzag refuses that, so a group and its mirror image lie on the same ranks).
  Chunk c holds in-segment indices (c mod g)·C ... + C - 1, so for a head set with offset o its kept rows
  start at u₀ = (o - (c mod g)·C) mod r, stride r. The block of a chunk's own kept rows runs locally
  (causal if the call is); the blocks against other chunks of the segment need their sparsified K/V: what
  the ring rotates and the all-gather gathers, a rank's chunks of the group(s) in one buffer. Under zigzag
  a rank's two chunks may share a segment (ŵ = N): their blocks against each other run locally.

Other lengths would split a segment unevenly over chunks; they are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from ..heads import KVHeadSet, kv_group
from ..pattern import Block, head_sets, pair_blocks, validate_pattern
from .exchange import pack_rows, packed_elements, unpack_rows
from .layout import chunk_count, chunk_owner, rank_chunks


def ranks_per_segment(
    segment: int, seq_len: int, world: int, name: str, pair: int = 0, layout: str = "contiguous"
) -> int:
    """The span rule: g, the chunks (layout.py: shards, or the 2p half-shards under zigzag) one segment of
    ŵ = min(segment, seq_len) positions spans; 1 when ŵ divides the chunk (the pair runs locally). Refused
    otherwise; under zigzag a segment spanning chunks must also divide N (whole groups of chunks)."""
    chunks = chunk_count(world, layout)
    span, chunk = min(segment, seq_len), seq_len // chunks
    if chunk % span == 0:
        return 1
    whole = layout == "contiguous" or seq_len % span == 0
    if span % chunk or not whole:
        what = f"shard length {chunk} = N/p = {seq_len}/{world}"
        if layout == "zigzag":
            what = f"zigzag chunk length {chunk} = N/(2p) = {seq_len}/{2 * world} (and dividing N)"
        raise ValueError(
            f"{name}: segment length {span} (pair {pair}) neither divides nor is a multiple of the {what}: use "
            "segment lengths that are divisors or multiples of it, or pad the sequence with "
            "shard_sequence(x, group, segment_lengths=..., layout=...) (distributed/sharding.py)"
        )
    return span // chunk


Unit = tuple[int, int]  # (chunk, local start): one chunk a rank holds and where its rows start in the shard


@dataclass(frozen=True)
class SpanningPair:
    """A pair whose segment spans several chunks; the ranks holding them are `group`, this rank member `index`.
    Contiguous shards: one chunk per member. Zigzag: each member holds two chunks (units), those of a
    segment group and of its mirror image (or of one group around the middle)."""

    pair: int
    rate: int
    shard_len: int  # the chunk length C (N/p contiguous, N/(2p) zigzag)
    group: tuple[int, ...]  # ranks of the process group that share this rank's segment(s)
    index: int
    ranks_per_segment: int  # g = ŵ / C, chunks per segment; the last group is smaller when C·g does not divide N
    sets: tuple[tuple[int, int, int, int], ...]  # (offset, head_start, head_step, heads) per head set
    kv_group: int = 1  # query heads per kv head (GQA): K/V travel at the kv heads (heads.py)
    first_set: int = 0  # this pair's first head set among all spanning pairs' (dropout streams)
    units: tuple[tuple[Unit, ...], ...] = ()  # per member, its units in this pair's groups
    ordered: bool = True  # members in sequence order (contiguous): a causal ring never wraps around

    @cached_property
    def kv_sets(self) -> tuple[KVHeadSet, ...]:
        """Per head set, its kv heads: what is packed, and how the receiver repeats them."""
        return tuple(KVHeadSet(h0, step, count, self.kv_group) for _, h0, step, count in self.sets)

    @cached_property
    def kv_heads(self) -> int:
        """H_i: the K/V heads one kept row carries, summed over the head sets."""
        return sum(kv.kv_count for kv in self.kv_sets)

    @cached_property
    def self_cross(self) -> bool:
        """This rank holds two chunks of one segment: their blocks against each other run here (no bytes)."""
        chunks = [c // self.ranks_per_segment for c, _ in self.units[self.index]]
        return len(set(chunks)) < len(chunks)

    def attends(self, query_chunk: int, key_chunk: int, causal: bool) -> bool:
        """Queries of one chunk attend the kept rows of another: same segment, earlier if causal."""
        same = query_chunk // self.ranks_per_segment == key_chunk // self.ranks_per_segment
        return same and query_chunk != key_chunk and (not causal or key_chunk < query_chunk)

    def entries(self, member: int) -> list[tuple[int, int, Block | None]]:
        """Per unit of `member`, per head set: (chunk, set index, its kept rows' block or None: no kept row)."""
        result = []
        for chunk, start in self.units[member]:
            index = chunk % self.ranks_per_segment  # the chunk's place in its segment
            for s, (offset, h0, step, count) in enumerate(self.sets):
                u0 = (offset - index * self.shard_len) % self.rate
                fits = u0 < self.shard_len
                block = Block(self.pair, start, 1, self.shard_len, u0, self.rate, h0, step, count) if fits else None
                result.append((chunk, s, block))
        return result

    def blocks(self, member: int) -> list[Block | None]:
        """The kept rows of `member` in its own shard, per unit and head set (None: no kept row)."""
        return [block for _, _, block in self.entries(member)]

    def _sizes(self, member: int, batch: int, head_dim: int, with_mask: bool) -> list[int]:
        """Per entry holding member rows, the elements of its packed K and V (and mask) rows."""
        return [
            packed_elements(batch, self.kv_sets[s].kv_count, head_dim, block.rows, with_mask)
            for _, s, block in self.entries(member)
            if block is not None
        ]

    def elements(self, member: int, batch: int, head_dim: int, with_mask: bool) -> int:
        """Elements of member's packed K and V (and mask) rows."""
        return sum(self._sizes(member, batch, head_dim, with_mask))

    def pack(self, k: torch.Tensor, v: torch.Tensor, key_pad: torch.Tensor | None) -> torch.Tensor:
        """This rank's kept K/V rows of every entry in one flat buffer, each laid out as the backends want
        it, (B, kv heads, rows, D), followed by its key mask rows, if any (exchange.py)."""
        parts = []
        for _, s, block in self.entries(self.index):
            if block is None:
                continue
            kv = self.kv_sets[s]
            end = block.start + block.seg_len
            mask = None if key_pad is None else key_pad[:, block.start + block.offset : end : block.rate]
            k_rows, v_rows = (kv.pack(block.view(x).flatten(0, 1), dim=2).transpose(1, 2) for x in (k, v))
            parts.append(pack_rows(k_rows, v_rows, mask))
        return torch.cat(parts) if parts else k.new_empty(0)

    @staticmethod
    def pack_grads(parts: list[tuple[torch.Tensor, torch.Tensor] | None], like: torch.Tensor) -> torch.Tensor:
        """dK, dV shares for a member's rows (per entry, (B, kv heads, rows, D)) in its pack layout."""
        flat = [pack_rows(*pair) for pair in parts if pair is not None]
        return torch.cat(flat) if flat else like.new_empty(0)

    def unpack(self, member: int, buffer: torch.Tensor, batch: int, head_dim: int, with_mask: bool):
        """Per entry of member: (k, v, key_pad) of its rows, or None where it keeps no row; k and v repeated
        from the kv heads to the set's query heads."""
        pieces = iter(buffer.split(self._sizes(member, batch, head_dim, with_mask)))
        result = []
        for _, s, block in self.entries(member):
            if block is None:
                result.append(None)
                continue
            kv = self.kv_sets[s]
            mask = (batch, block.rows) if with_mask else None
            k, v, pad = unpack_rows(next(pieces), (batch, kv.kv_count, block.rows, head_dim), mask)
            result.append((kv.unpack(k, dim=1), kv.unpack(v, dim=1), pad))
        return result

    def unpack_grads(self, buffer: torch.Tensor, batch: int, head_dim: int):
        """Per entry of this rank's own rows: (dk, dv) as (B, kv heads, rows, D), or None."""
        pieces = iter(buffer.split(self._sizes(self.index, batch, head_dim, False)))
        return [
            None
            if block is None
            else unpack_rows(next(pieces), (batch, self.kv_sets[s].kv_count, block.rows, head_dim))[:2]
            for _, s, block in self.entries(self.index)
        ]


def _group(rank: int, world: int, span: int, chunk: int, layout: str):
    """The ranks holding chunks of this rank's segment groups, and each one's units in those groups."""
    chunks = rank_chunks(rank, world, layout)
    groups = {c // span for c in chunks}
    members = sorted({chunk_owner(c, world, layout)[0] for g in groups for c in range(g * span, (g + 1) * span)})
    members = [m for m in members if m < world]  # a short last group (contiguous)
    units = tuple(
        tuple((c, i * chunk) for i, c in enumerate(rank_chunks(m, world, layout)) if c // span in groups)
        for m in members
    )
    return tuple(members), units


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
    layout: str = "contiguous",
    head_range: tuple[int, int] | None = None,
) -> tuple[list[Block], list[SpanningPair]]:
    """Local blocks (pairs inside the chunks, and each spanning pair's own-rows blocks) and spanning pairs.
    head_range = (first, total): the heads are global heads first .. of total (a hybrid's head shard)."""
    heads = head_range or (0, num_heads)
    chunks = chunk_count(world, layout)
    if seq_len % chunks:
        raise ValueError(
            f"{name}: the shard length {seq_len // world} is odd: layout={layout!r} cuts each shard into two "
            "chunks; pad with shard_sequence(x, group, segment_lengths=..., layout=layout)"
        )
    shard, chunk = seq_len // world, seq_len // chunks
    local: list[Block] = []
    spanning: list[SpanningPair] = []
    first_set = 0
    for pair, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        size = ranks_per_segment(w, seq_len, world, name, pair, layout)
        if size == 1:
            local.extend(
                pair_blocks(pair, shard, num_heads, min(w, seq_len), r, len(segment_lengths), semantics, *heads)
            )
            continue
        group, units = _group(rank, world, size, chunk, layout)
        sets = tuple(head_sets(pair, r, num_heads, len(segment_lengths), semantics, *heads))
        ordered = layout == "contiguous"
        plan = SpanningPair(pair, r, chunk, group, group.index(rank), size, sets, kv_group, first_set, units, ordered)
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
    layout: str = "contiguous",
    head_range: tuple[int, int] | None = None,
) -> list[dict[str, int]]:
    """Closed-form bytes per rank (docs/communication.md) for strategy 'ring' or 'allgather': `pair_traffic`
    over the shard plan's kept-row counts, without running anything. num_kv_heads (GQA): K/V and their
    shares travel at the kv heads of each head set. layout (layout.py): under zigzag a member's buffer holds
    its two chunks' rows and a causal ring wraps around (every step moves a buffer). head_range: as shard_plan's."""
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    group = kv_group(num_heads, num_heads if num_kv_heads is None else num_kv_heads)
    counts = []
    for rank in range(world):
        totals = [0, 0, 0, 0]
        _, spanning = shard_plan(
            seq_len, world, rank, num_heads, segs, rates, semantics, strategy, group, layout, head_range
        )
        for plan in spanning:
            members = range(len(plan.group))
            size = [plan.elements(j, batch, head_dim, with_mask) * element_bytes for j in members]
            grad = [plan.elements(j, batch, head_dim, False) * element_bytes for j in members]
            causal = is_causal and plan.ordered
            totals = [t + x for t, x in zip(totals, pair_traffic(strategy, size, grad, plan.index, causal))]
        counts.append(dict(zip(TRAFFIC_KEYS, totals)))
    return counts
