"""What the sequence-parallel implementations (ring, all-gather) share: the shard plan, the packing of
sparsified K/V rows, and the module shell around the engine.

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
import torch.distributed as dist

from ..backends import BACKENDS
from ..documents import whole_sequence
from ..engine import BlockAttention, ViewAccess, block_attention
from ..heads import KVHeadSet, kv_group
from ..pattern import Block, head_sets, pair_blocks, validate_pattern
from ..validation import check_key_padding_mask, check_qkv
from .comm import DistributedAttention, check_consistent, group_rank_size
from .documents import sharded_documents


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

    @cached_property
    def kv_sets(self) -> tuple[KVHeadSet, ...]:
        """Per head set, its kv heads: what is packed, and how the receiver repeats them."""
        return tuple(KVHeadSet(h0, step, count, self.kv_group) for _, h0, step, count in self.sets)

    def blocks(self, member: int) -> list[Block | None]:
        """Per head set, the kept rows of group member `member` in its own shard (None: no kept row)."""
        result = []
        for offset, h0, step, count in self.sets:
            u0 = (offset - member * self.shard_len) % self.rate
            result.append(
                Block(self.pair, 0, 1, self.shard_len, u0, self.rate, h0, step, count) if u0 < self.shard_len else None
            )
        return result

    def elements(self, member: int, batch: int, head_dim: int, with_mask: bool) -> int:
        """Elements of member's packed K and V (and mask) rows."""
        per_row = 2 * head_dim
        total = 0
        for block, kv in zip(self.blocks(member), self.kv_sets):
            if block is not None:
                total += batch * block.rows * (kv.kv_count * per_row + (1 if with_mask else 0))
        return total

    def pack(self, k: torch.Tensor, v: torch.Tensor, key_pad: torch.Tensor | None) -> torch.Tensor:
        """This rank's kept K/V rows of every head set in one flat buffer, each head set laid out as the
        backends want it, (B, heads, rows, D); the key mask rows, if any, as 0/1 values at the end."""
        parts = []
        for block, kv in zip(self.blocks(self.index), self.kv_sets):
            if block is None:
                continue
            for x in (k, v):
                parts.append(kv.pack(block.view(x).flatten(0, 1), dim=2).transpose(1, 2).reshape(-1))
            if key_pad is not None:
                parts.append(key_pad[:, block.offset :: block.rate].to(k.dtype).reshape(-1))
        if not parts:
            return k.new_empty(0)
        return torch.cat(parts)

    @staticmethod
    def pack_grads(parts: list[tuple[torch.Tensor, torch.Tensor] | None], like: torch.Tensor) -> torch.Tensor:
        """dK, dV shares for a member's rows (per head set, (B, kv heads, rows, D)) in its pack layout."""
        flat = [t.reshape(-1) for pair in parts if pair is not None for t in pair]
        return torch.cat(flat) if flat else like.new_empty(0)

    def seed_index(self, set_index: int, member: int) -> int:
        """A block number for dropout seeds, distinct from the local blocks' and the same in backward."""
        return 1_000_000 + 10_000 * self.pair + 100 * set_index + member

    def unpack(self, member: int, buffer: torch.Tensor, batch: int, head_dim: int, with_mask: bool):
        """Per head set: (k, v, key_pad) of member's rows, or None where it keeps no row; k and v repeated
        from the kv heads to the set's query heads."""
        result, at = [], 0
        for block, kv in zip(self.blocks(member), self.kv_sets):
            if block is None:
                result.append(None)
                continue
            shape = (batch, kv.kv_count, block.rows, head_dim)
            size = batch * kv.kv_count * block.rows * head_dim
            k = kv.unpack(buffer[at : at + size].view(shape), dim=1)
            v = kv.unpack(buffer[at + size : at + 2 * size].view(shape), dim=1)
            at += 2 * size
            mask = None
            if with_mask:
                mask = buffer[at : at + batch * block.rows].view(batch, block.rows) > 0.5
                at += batch * block.rows
            result.append((k, v, mask))
        return result

    def unpack_grads(self, buffer: torch.Tensor, batch: int, head_dim: int):
        """Per head set of this rank's own rows: (dk, dv) as (B, kv heads, rows, D), or None."""
        result, at = [], 0
        for block, kv in zip(self.blocks(self.index), self.kv_sets):
            if block is None:
                result.append(None)
                continue
            size = batch * kv.kv_count * block.rows * head_dim
            shape = (batch, kv.kv_count, block.rows, head_dim)
            result.append((buffer[at : at + size].view(shape), buffer[at + size : at + 2 * size].view(shape)))
            at += 2 * size
        return result


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
    for pair, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        span = min(w, seq_len)
        if shard % span == 0:
            local.extend(pair_blocks(pair, shard, num_heads, span, r, len(segment_lengths), semantics))
            continue
        if span % shard:
            raise ValueError(
                f"{name}: segment length {span} (pair {pair}) neither divides nor is a multiple of the shard length "
                f"{shard} = N/p = {seq_len}/{world}: use segment lengths that are divisors or multiples of N/p"
            )
        size = span // shard
        first = rank - rank % size
        group = tuple(range(first, min(first + size, world)))
        sets = tuple(head_sets(pair, r, num_heads, len(segment_lengths), semantics))
        plan = SpanningPair(pair, r, shard, group, rank - first, size, sets, kv_group)
        local.extend(b for b in plan.blocks(plan.index) if b is not None)
        spanning.append(plan)  # also when its group is this rank alone (a short last segment): no bytes then
    return local, spanning


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
    """Closed-form bytes per rank (docs/communication.md) for strategy 'ring' or 'allgather'.

    Counted from the shard plan's kept-row counts alone, without running anything: S_j = elements of
    member j's packed K/V; ring: non-causal, each rank sends and receives g-1 buffers forward, and in
    backward the rotation again plus the dK/dV shares sent home; causal sends only what a later rank
    uses. All-gather: g-1 copies of the largest buffer each way forward; the reduce-scatter of dK/dV
    (the same size) backward. num_kv_heads (GQA): K/V and their shares travel at the kv heads of each head set.
    """
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    group = kv_group(num_heads, num_heads if num_kv_heads is None else num_kv_heads)
    counts = []
    for rank in range(world):
        totals = dict(forward_bytes_sent=0, forward_bytes_received=0, backward_bytes_sent=0, backward_bytes_received=0)
        _, spanning = shard_plan(seq_len, world, rank, num_heads, segs, rates, semantics, strategy, group)
        for plan in spanning:
            g, a = len(plan.group), plan.index
            if g == 1:
                continue
            size = [plan.elements(j, batch, head_dim, with_mask) * element_bytes for j in range(g)]
            grad = [plan.elements(j, batch, head_dim, False) * element_bytes for j in range(g)]
            if strategy == "allgather":
                moved = (g - 1) * max(size)
                totals["forward_bytes_sent"] += moved
                totals["forward_bytes_received"] += moved
                totals["backward_bytes_sent"] += (g - 1) * max(grad)
                totals["backward_bytes_received"] += (g - 1) * max(grad)
                continue
            steps = range(1, g)
            sent = [size[(a - t + 1) % g] for t in steps if ring_sends(a, t, g, is_causal)]
            recv = [size[(a - t) % g] for t in steps if ring_receives(a, t, g, is_causal)]
            home_sent = [grad[(a - t) % g] for t in steps if ring_computes(a, t, g, is_causal)]
            home_recv = [grad[a] for t in steps if ring_computes((a + t) % g, t, g, is_causal)]
            totals["forward_bytes_sent"] += sum(sent)
            totals["forward_bytes_received"] += sum(recv)
            totals["backward_bytes_sent"] += sum(sent) + sum(home_sent)
            totals["backward_bytes_received"] += sum(recv) + sum(home_recv)
        counts.append(totals)
    return counts


# Ring schedule: at step t (1 .. g-1) member a computes on the rows of member (a - t) mod g, which it
# received at step t from a - 1. Causal: only earlier members' rows matter, so nothing wraps around.
def ring_computes(a: int, t: int, g: int, causal: bool) -> bool:
    return not causal or a - t >= 0


def ring_receives(a: int, t: int, g: int, causal: bool) -> bool:
    return ring_computes(a, t, g, causal)


def ring_sends(a: int, t: int, g: int, causal: bool) -> bool:
    return ring_receives((a + 1) % g, t, g, causal)


class SequenceParallelBase(DistributedAttention):
    """Contiguous sequence shards in, shards out. Subclasses supply `exchange_class`, the KeyBlockExecutor
    strategy (ring rotation or all-gather) for the pairs whose segments span several ranks.

    Every transfer happens inside `process_group` (point-to-point between a segment's ranks, or a
    collective on the whole group): no sub-group is ever created, because torch's new_group is collective
    over the whole job and ranks of different sequence-parallel groups (data x sequence parallel) would
    call it with different rank lists and hang."""

    exchange_class: type
    strategy_summary = ""

    def global_rank(self, group_rank: int) -> int:
        """A rank of `process_group` as the global rank that point-to-point calls take."""
        if self.process_group is None:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    def forward_with_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of this rank's shard of the whole sequence; cu_seqlens: packed documents of the whole
        sequence, the same on every rank (distributed/documents.py)."""
        rank, world = group_rank_size(self.process_group)
        if world == 1:
            return self.attention.forward_with_lse(
                q, k, v, is_causal, key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens
            )
        check_qkv(q, k, v)
        batch, shard, num_heads, _ = q.shape
        check_key_padding_mask(key_padding_mask, batch, shard, q.device)
        name = type(self).__name__
        if not whole_sequence(cu_seqlens, shard * world):
            return self._documents(q, k, v, is_causal, key_padding_mask, cu_seqlens)
        group = kv_group(num_heads, k.shape[2])
        # GQA: the engine repeats k, v to H heads inside its autograd boundary; packed at the kv heads (heads.py)
        local, spanning = shard_plan(
            shard * world,
            world,
            rank,
            num_heads,
            self.segment_lengths,
            self.dilation_rates,
            self.semantics,
            name,
            group,
        )
        config = (
            f"{self.segment_lengths}|{self.dilation_rates}|{self.semantics}|{is_causal}|{group}|"
            f"{key_padding_mask is not None}|{self.attention.dropout}|{self.training}"
        )
        check_consistent(self.process_group, name, tuple(q.shape), q.dtype, config, q.device, owner=self)
        self.stats.call()
        backend, call, pool = self.attention.prepare_call(q, is_causal, key_padding_mask is not None)
        remote = self.exchange_class(self, spanning, world) if spanning else None
        engine = BlockAttention(local, ViewAccess(pool), backend, call, pool, remote)
        return block_attention(q, k, v, key_padding_mask, engine)

    def _documents(self, q, k, v, is_causal, key_padding_mask, cu_seqlens):
        """Packed documents: local calls, the rows of documents crossing shards all-gathered."""
        config = (
            f"{self.segment_lengths}|{self.dilation_rates}|{self.semantics}|{is_causal}|{k.shape[2]}|"
            f"{key_padding_mask is not None}|{self.attention.dropout}|{self.training}|documents"
        )
        check_consistent(self.process_group, type(self).__name__, tuple(q.shape), q.dtype, config, q.device, owner=self)
        return sharded_documents(
            lambda *x: self.attention.forward_with_lse(*x[:3], is_causal, key_padding_mask=x[3]),
            q,
            k,
            v,
            key_padding_mask,
            cu_seqlens,
            self.process_group,
            self.stats,
            type(self).__name__,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, k, v: this rank's shard (batch, N/p, heads, head_dim) -> its output shard."""
        return self.forward_with_lse(q, k, v, is_causal, key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens)[0]

    def describe(self) -> str:
        _, world = group_rank_size(self.process_group)
        return (
            f"{type(self).__name__} over {world} rank(s) ({self.strategy_summary}); "
            f"single-shard engine: " + self.attention.describe()
        )


def attend_member(attention: BlockAttention, plan: SpanningPair, member: int, rows: list, q, out, lse) -> None:
    """Merge this rank's kept queries' attention over `member`'s kept rows (unpacked) into out, lse.
    The keys are all earlier than the queries, or the block is not computed at all: never causal."""
    backend = BACKENDS[attention.backend]
    for set_index, (q_block, kv) in enumerate(zip(plan.blocks(plan.index), rows)):
        if q_block is None or kv is None:
            continue
        k_rows, v_rows, mask = kv
        qb = attention.access.gather(q, q_block).transpose(1, 2)
        call = attention._call(plan.seed_index(set_index, member), causal=False)
        block_out, block_lse = backend.forward(qb, k_rows, v_rows, mask, call)
        attention.access.release(qb)
        attention.access.merge(out, lse, q_block, block_out.transpose(1, 2), block_lse.transpose(1, 2))


def attend_member_backward(
    attention: BlockAttention, plan: SpanningPair, member: int, rows: list, dout, q, out, lse, dq
) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Backward of `attend_member` with the merged out and lse: adds into dq, returns per head set the
    (dk, dv) shares of member's rows, (B, heads, rows, D), to be sent home."""
    backend = BACKENDS[attention.backend]
    shares: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for set_index, (q_block, kv) in enumerate(zip(plan.blocks(plan.index), rows)):
        if kv is None:
            continue
        k_rows, v_rows, mask = kv
        kv_heads = plan.kv_sets[set_index]
        if q_block is None:  # no local query in this head set: member's rows get a zero share
            zeros = k_rows.new_zeros((k_rows.shape[0], kv_heads.kv_count, *k_rows.shape[2:]))
            shares.append((zeros, zeros.clone()))
            continue
        qb, dob, ob = (attention.access.gather(x, q_block).transpose(1, 2) for x in (q, dout, out))
        lb = attention.access.gather(lse, q_block).transpose(1, 2)
        call = attention._call(plan.seed_index(set_index, member), causal=False)
        dq_part, dk_part, dv_part = backend.backward(dob, qb, k_rows, v_rows, ob, lb, mask, call)
        attention.access.release(qb, dob, ob)
        attention.access.add(dq, q_block, dq_part.transpose(1, 2))
        shares.append((kv_heads.reduce(dk_part, 1), kv_heads.reduce(dv_part, 1)))
    return shares


def add_home_shares(
    attention: BlockAttention, plan: SpanningPair, buffer: torch.Tensor, dk, dv, batch, head_dim
) -> None:
    """Add dK/dV shares of this rank's own kept rows, computed on other ranks, into its accumulators."""
    for block, kv, share in zip(plan.blocks(plan.index), plan.kv_sets, plan.unpack_grads(buffer, batch, head_dim)):
        if share is not None:  # kv-head sums, placed on the kept heads of the repeated K/V's gradient
            attention.access.add(dk, block, kv.place(share[0], 1).transpose(1, 2))
            attention.access.add(dv, block, kv.place(share[1], 1).transpose(1, 2))
