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
from .documents import sharded_documents
from .shards import SpanningPair, comm_volume, shard_plan

__all__ = ["SequenceParallelBase", "comm_volume", "shard_plan"]


class SequenceParallelBase(DistributedAttention):
    """Contiguous sequence shards in, shards out. Subclasses supply `exchange_class`, the KeyBlockExecutor
    strategy (ring rotation or all-gather) for the pairs whose segments span several ranks.

    Every transfer happens inside `process_group` (point-to-point between a segment's ranks, or a
    collective on the whole group): no sub-group is ever created, because torch's new_group is collective
    over the whole job and ranks of different sequence-parallel groups (data x sequence parallel) would
    call it with different rank lists and hang."""

    exchange_class: type
    strategy_summary = ""

    def _distributed(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse, rank, world):
        shard, num_heads = q.shape[1], q.shape[2]
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
        check_call(self, q, k, is_causal, key_padding_mask)
        self.stats.call()
        backend, call, pool = self.attention.prepare_call(q, is_causal, key_padding_mask is not None)
        remote = self.exchange_class(self, spanning, world) if spanning else None
        engine = BlockAttention(local, ViewAccess(pool), backend, call, pool, remote, rank)
        return block_attention(q, k, v, key_padding_mask, engine)

    def _documents(self, q, k, v, is_causal, key_padding_mask, cu_seqlens):
        """Packed documents: local calls, the rows of documents crossing shards all-gathered."""
        check_call(self, q, k, is_causal, key_padding_mask, "documents")
        name = type(self).__name__
        return sharded_documents(
            lambda *x: self.attention.forward_with_lse(*x[:3], is_causal, key_padding_mask=x[3]),
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
        call = attention._call(plan.first_set + set_index, 1 + member, causal=False)
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
        call = attention._call(plan.first_set + set_index, 1 + member, causal=False)
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
