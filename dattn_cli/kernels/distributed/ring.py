"""Ring dilated attention: sparsified K/V rotate around the ranks that share a segment.

For each pair whose segment spans g ranks (see sequence_parallel.py), each rank packs its kept K/V rows
(the sparsified K/V: 1/r of the rows per head) and the g ranks of the segment pass these buffers around
their sub-ring with `batch_isend_irecv`; at step t a rank attends its kept queries to the rows of the
member t places before it. The transfer for step t + 1 is posted before step t is computed, so
communication overlaps compute. Partial results merge with the one merge routine.

Backward rotates the K/V buffers again (nothing of size g·L is kept from the forward) and sends each
dK/dV share straight back to the rank that owns those rows, overlapped with the next step.

Causal, contiguous shards: a rank needs only earlier ranks' rows, so a buffer travels forward and never
wraps around; member a of the group computes a remote blocks while member 0 computes none. Zigzag shards
(layout.py) balance that: each rank holds an early and a late chunk, every buffer goes all the way round,
and each step computes only the (query chunk, key chunk) blocks of one segment with the keys earlier
(SpanningPair.attends); a rank's two chunks of one segment meet locally first (attend_own).
"""

from __future__ import annotations

from ..engine import BlockAttention
from .exchange import exchange
from .sequence_parallel import (
    SequenceParallelBase,
    add_home_shares,
    attend_member,
    attend_member_backward,
    attend_own,
    attend_own_backward,
)
from .shards import SpanningPair, ring_computes, ring_receives, ring_sends

TAG_KV, TAG_HOME = 11, 12


class RingExchange:
    """KeyBlockExecutor (engine.py) of the ring strategy (one object per forward call, kept for its backward)."""

    def __init__(self, module: SequenceParallelBase, spanning: list[SpanningPair], world: int):
        self.module = module
        self.spanning = [plan for plan in spanning if len(plan.group) > 1 or plan.self_cross]

    def _p2p(self, plan, send, send_to, recv, recv_from, tag, phase):
        """Post `send` to member send_to and `recv` from member recv_from (either may be None); the works."""
        sends = {} if send is None else {plan.group[send_to]: send}
        receives = {} if recv is None else {plan.group[recv_from]: recv}
        module = self.module
        return exchange(sends, receives, module.process_group, module.stats, tag, phase, wait=False)

    def _rotation(self, plan: SpanningPair, k, v, key_pad, causal: bool, phase: str):
        """Yields (step, member, rows) for each block this rank computes, prefetching the next buffer."""
        g, a = len(plan.group), plan.index
        batch, head_dim = k.shape[0], k.shape[-1]
        with_mask = key_pad is not None

        def post(step, held):
            send = held if ring_sends(a, step, g, causal) else None
            recv = None
            if ring_receives(a, step, g, causal):
                recv = k.new_empty(plan.elements((a - step) % g, batch, head_dim, with_mask))
            return recv, self._p2p(plan, send, (a + 1) % g, recv, (a - 1) % g, TAG_KV, phase)

        recv, works = post(1, plan.pack(k, v, key_pad))
        for step in range(1, g):
            for work in works:
                work.wait()
            held = recv
            if step + 1 < g:
                recv, works = post(step + 1, held)  # pass it on while this step computes
            if ring_computes(a, step, g, causal):
                member = (a - step) % g
                yield step, member, plan.unpack(member, held, batch, head_dim, with_mask)

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        for plan in self.spanning:
            attend_own(attention, plan, q, k, v, key_pad, out, lse)
            if len(plan.group) == 1:
                continue
            causal = attention.call.causal and plan.ordered  # the schedule's: zigzag buffers go all the way round
            for _, member, rows in self._rotation(plan, k, v, key_pad, causal, "forward"):
                attend_member(attention, plan, member, rows, q, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads: list) -> None:
        dq, dk, dv = grads
        batch, head_dim = q.shape[0], q.shape[-1]
        for plan in self.spanning:
            attend_own_backward(attention, plan, dout, q, k, v, out, lse, key_pad, grads)
            g, a = len(plan.group), plan.index
            causal = attention.call.causal and plan.ordered
            pending = None
            for step, member, rows in self._rotation(plan, k, v, key_pad, causal, "backward"):
                shares = attend_member_backward(attention, plan, member, rows, dout, q, out, lse, dq)
                pending = self._finish_home(attention, plan, pending, dk, dv, batch, head_dim)
                pending = self._post_home(plan, step, plan.pack_grads(shares, k), k, causal)
            # steps this rank computed nothing in still bring shares of its rows home from later ranks
            for step in range(1, g):
                if not ring_computes(a, step, g, causal):
                    pending = self._finish_home(attention, plan, pending, dk, dv, batch, head_dim)
                    pending = self._post_home(plan, step, None, k, causal)
            self._finish_home(attention, plan, pending, dk, dv, batch, head_dim)

    def _post_home(self, plan: SpanningPair, step: int, share, like, causal: bool):
        """Step `step`'s dK/dV exchange: my share to the member I computed on, theirs of my rows to me."""
        g, a = len(plan.group), plan.index
        computer = (a + step) % g  # the member that computed on my rows at this step
        recv = None
        if ring_computes(computer, step, g, causal):
            recv = like.new_empty(plan.elements(a, like.shape[0], like.shape[-1], False))
        works = self._p2p(plan, share, (a - step) % g, recv, computer, TAG_HOME, "backward")
        return recv, works

    def _finish_home(self, attention, plan, pending, dk, dv, batch, head_dim):
        if pending is not None:
            recv, works = pending
            for work in works:
                work.wait()
            if recv is not None:
                add_home_shares(attention, plan, recv, dk, dv, batch, head_dim)
        return None


class RingDilatedAttention(SequenceParallelBase):
    """Sequence-parallel dilated attention; sparsified K/V rotate around each segment's sub-ring."""

    exchange_class = RingExchange
    strategy_summary = "sparsified K/V rotated around each segment's ranks with batch_isend_irecv, overlapped"
