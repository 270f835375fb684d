"""What the sequence-parallel implementations (ring, all-gather) share: the module shell around the engine,
and attending the kept rows other group members send (their shard plan and packing: shards.py).
"""

from __future__ import annotations

import torch

from ..backends import BACKENDS
from ..documents import whole_sequence
from ..engine import BlockAttention, ViewAccess, block_attention
from ..heads import kv_group
from .comm import DistributedAttention, check_call, group_rank_size
from .document_layout import balanced_documents, document_layout
from .documents import check_documents, sharded_documents
from .layout import DOCUMENTS, check_layout
from .shards import SpanningPair, comm_volume, shard_plan

__all__ = ["SequenceParallelBase", "comm_volume", "shard_plan"]


class SequenceParallelBase(DistributedAttention):
    """Sequence shards in, shards out: contiguous, zigzag (layout.py: chunks a and 2p-1-a of 2p, which
    balances causal work; shard with shard_sequence(..., layout=...)), or packed documents balanced
    (layout="documents", document_layout.py). Subclasses supply `exchange_class`, the
    KeyBlockExecutor strategy (ring rotation or all-gather) for the pairs whose segments span several ranks.

    Every transfer happens inside `process_group` (point-to-point between a segment's ranks, or a
    collective on the whole group): no sub-group is ever created, because torch's new_group is collective
    over the whole job and ranks of different sequence-parallel groups (data x sequence parallel) would
    call it with different rank lists and hang."""

    exchange_class: type
    strategy_summary = ""

    def __init__(self, segment_lengths, dilation_rates, *, layout: str = "contiguous", **kwargs):
        super().__init__(segment_lengths, dilation_rates, **kwargs)
        self.layout = check_layout(layout, documents=True)

    def signature(self) -> str:
        return f"{super().signature()}|{self.layout}"

    def _distributed(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse, rank, world):
        name = type(self).__name__
        if self.layout == DOCUMENTS:
            return self._balanced(q, k, v, is_causal, key_padding_mask, cu_seqlens, rank, world)
        if not whole_sequence(cu_seqlens, q.shape[1] * world):
            if self.layout != "contiguous":
                raise ValueError(
                    f"{name}: packed documents (cu_seqlens) are not supported with layout={self.layout!r}: "
                    "use layout='documents' (balanced) or 'contiguous' for packed documents"
                )
            return self._documents(q, k, v, is_causal, key_padding_mask, cu_seqlens)
        check_call(self, q, k, is_causal, key_padding_mask)
        self.stats.call()
        return self._sequence(q, k, v, is_causal, key_padding_mask, rank, world, self.layout)

    def _sequence(self, q, k, v, is_causal, key_padding_mask, rank, world, layout):
        """(out, lse) of one sequence sharded over the group under `layout` (contiguous or zigzag)."""
        shard, num_heads = q.shape[1], q.shape[2]
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
            type(self).__name__,
            group,
            layout,
            self.head_range(num_heads),
        )
        backend, call, pool = self.attention.prepare_call(q, is_causal, key_padding_mask is not None)
        remote = self.exchange_class(self, spanning, world) if spanning else None
        engine = BlockAttention(local, ViewAccess(pool), backend, call, pool, remote, rank)
        return block_attention(q, k, v, key_padding_mask, engine)

    def _balanced(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, rank, world):
        """layout="documents": whole documents locally, the spread ones through the zigzag ring (document_layout.py)."""
        name = type(self).__name__
        if cu_seqlens is None:
            raise ValueError(
                f"{name}: layout='documents' needs the packed documents: pass cu_seqlens (the whole unpadded "
                "sequence's, the same on every rank) and shards from shard_sequence(x, layout=document_layout(...))"
            )
        layout = document_layout(cu_seqlens, world, self.segment_lengths)
        if q.shape[1] != layout.shard_len or q.shape[0] != 1:
            raise ValueError(
                f"{name}: shard shape {tuple(q.shape[:2])} is not (1, {layout.shard_len}), this rank's under "
                f"document_layout(cu_seqlens, {world}, segment_lengths={list(self.segment_lengths)}): shard with it"
            )
        check_call(self, q, k, is_causal, key_padding_mask, "documents")
        check_documents(self.process_group, name, [str(layout)], q.device)
        self.stats.call()
        return balanced_documents(
            lambda *x: self.attention.forward_with_lse(*x[:3], is_causal, key_padding_mask=x[3]),
            lambda *x: self._sequence(*x[:3], is_causal, x[3], rank, world, "zigzag"),
            q,
            k,
            v,
            key_padding_mask,
            layout,
            rank,
        )

    def _documents(self, q, k, v, is_causal, key_padding_mask, cu_seqlens):
        """Packed documents: local calls, the rows of documents crossing shards all-gathered."""
        check_call(self, q, k, is_causal, key_padding_mask, "documents")
        name = type(self).__name__
        return sharded_documents(
            lambda *x: self.attention.forward_with_lse(
                *x[:3], is_causal, key_padding_mask=x[3], head_range=self.head_range(x[0].shape[2])
            ),
            q,
            k,
            v,
            key_padding_mask,
            cu_seqlens,
            self.process_group,
            self.stats,
            name,
        )

    def describe(self) -> str:
        _, world = group_rank_size(self.process_group)
        zigzag = {"zigzag": ", zigzag shards", DOCUMENTS: ", documents balanced"}.get(self.layout, "")
        return (
            f"{type(self).__name__} over {world} rank(s){zigzag} ({self.strategy_summary}); "
            f"single-shard engine: " + self.attention.describe()
        )


def _combos(plan: SpanningPair, member: int, rows: list, causal: bool):
    """(stream member, own entry's set, own block, member's entry index) of each block this rank computes
    against `member`'s rows: same head set, same segment, earlier if causal (SpanningPair.attends)."""
    own, theirs = plan.entries(plan.index), plan.entries(member)
    per_unit, width = len(plan.sets), len(plan.group)
    for qi, (q_chunk, s, q_block) in enumerate(own):
        if q_block is None:
            continue
        for ki, (k_chunk, s_k, _) in enumerate(theirs):
            if s_k == s and rows[ki] is not None and plan.attends(q_chunk, k_chunk, causal):
                # dropout streams: one per (query unit, key unit); contiguous shards keep 1 + member
                stream = 1 + member + width * (2 * (qi // per_unit) + ki // per_unit)
                yield stream, s, q_block, ki


def attend_member(attention: BlockAttention, plan: SpanningPair, member: int, rows: list, q, out, lse) -> None:
    """Merge this rank's kept queries' attention over `member`'s kept rows (unpacked) into out, lse.
    The keys are all earlier than the queries, or the block is not computed at all: never causal."""
    backend = BACKENDS[attention.backend]
    for stream, s, q_block, ki in _combos(plan, member, rows, attention.call.causal):
        k_rows, v_rows, mask = rows[ki]
        qb = attention.access.gather(q, q_block).transpose(1, 2)
        call = attention._call(plan.first_set + s, stream, causal=False)
        block_out, block_lse = backend.forward(qb, k_rows, v_rows, mask, call)
        attention.access.release(qb)
        attention.access.merge(out, lse, q_block, block_out.transpose(1, 2), block_lse.transpose(1, 2))


def attend_member_backward(
    attention: BlockAttention, plan: SpanningPair, member: int, rows: list, dout, q, out, lse, dq
) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Backward of `attend_member` with the merged out and lse: adds into dq, returns per entry of member the
    (dk, dv) shares of its rows, (B, kv heads, rows, D) (zero where no local query attends them; None where
    it keeps no row), to be sent home."""
    backend = BACKENDS[attention.backend]
    shares: list = [None] * len(rows)
    for stream, s, q_block, ki in _combos(plan, member, rows, attention.call.causal):
        k_rows, v_rows, mask = rows[ki]
        qb, dob, ob = (attention.access.gather(x, q_block).transpose(1, 2) for x in (q, dout, out))
        lb = attention.access.gather(lse, q_block).transpose(1, 2)
        call = attention._call(plan.first_set + s, stream, causal=False)
        dq_part, dk_part, dv_part = backend.backward(dob, qb, k_rows, v_rows, ob, lb, mask, call)
        attention.access.release(qb, dob, ob)
        attention.access.add(dq, q_block, dq_part.transpose(1, 2))
        kv = plan.kv_sets[s]
        dk_part, dv_part = kv.reduce(dk_part, 1), kv.reduce(dv_part, 1)
        shares[ki] = (dk_part, dv_part) if shares[ki] is None else (shares[ki][0] + dk_part, shares[ki][1] + dv_part)
    entries = plan.entries(member)
    for ki, kv in enumerate(rows):
        if kv is not None and shares[ki] is None:  # no local query attends these rows: a zero share
            zeros = kv[0].new_zeros((kv[0].shape[0], plan.kv_sets[entries[ki][1]].kv_count, *kv[0].shape[2:]))
            shares[ki] = (zeros, zeros.clone())
    return shares


def add_home_shares(
    attention: BlockAttention, plan: SpanningPair, buffer: torch.Tensor, dk, dv, batch, head_dim
) -> None:
    """Add dK/dV shares of this rank's own kept rows, computed on other ranks, into its accumulators."""
    shares = plan.unpack_grads(buffer, batch, head_dim)
    for (_, s, block), share in zip(plan.entries(plan.index), shares):
        if share is not None:  # kv-head sums, placed on the kept heads of the repeated K/V's gradient
            kv = plan.kv_sets[s]
            attention.access.add(dk, block, kv.place(share[0], 1).transpose(1, 2))
            attention.access.add(dv, block, kv.place(share[1], 1).transpose(1, 2))


def _own_rows(plan: SpanningPair, k, v, key_pad) -> list:
    return plan.unpack(plan.index, plan.pack(k, v, key_pad), k.shape[0], k.shape[-1], key_pad is not None)


def attend_own(attention: BlockAttention, plan: SpanningPair, q, k, v, key_pad, out, lse) -> None:
    """Zigzag: this rank's two chunks of one segment against each other (no bytes move)."""
    if plan.self_cross:
        attend_member(attention, plan, plan.index, _own_rows(plan, k, v, key_pad), q, out, lse)


def attend_own_backward(attention: BlockAttention, plan: SpanningPair, dout, q, k, v, out, lse, key_pad, grads):
    """Backward of `attend_own`: dq, and the dK/dV shares added straight into this rank's accumulators."""
    if plan.self_cross:
        dq, dk, dv = grads
        shares = attend_member_backward(
            attention, plan, plan.index, _own_rows(plan, k, v, key_pad), dout, q, out, lse, dq
        )
        add_home_shares(attention, plan, plan.pack_grads(shares, k), dk, dv, k.shape[0], k.shape[-1])
