"""The LongNet paper's distributed algorithm: sparsify K/V locally, all-gather them within each
segment's rank group, attend local queries to every member's rows; backward reduce-scatters the dK/dV
shares so each rank receives the sum of the shares of its own rows. Queries and outputs stay local.
The "all-gather" of a segment whose ranks are not the whole process group is point-to-point (below).

All-gather needs equal sizes: when ranks of a group keep different numbers of rows (L not divisible
by r), every buffer is padded to the largest; the byte counts include the padding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..engine import BlockAttention
from .exchange import exchange, tensor_bytes
from .sequence_parallel import (
    SequenceParallelBase,
    add_home_shares,
    attend_member,
    attend_member_backward,
    attend_own,
    attend_own_backward,
)
from .shards import SpanningPair

TAG_GATHER, TAG_SCATTER = 31, 32


class AllGatherExchange:
    """KeyBlockExecutor (engine.py) of the all-gather strategy; keeps the gathered rows for its backward.

    A segment's g ranks exchange within the module's process group: with the collectives
    (all_gather_single / reduce_scatter_single) when they are the whole group, else point-to-point with
    each other member (batch_isend_irecv, the same padded buffers, so the same bytes). Never a sub-group:
    new_group is collective over the whole job and would hang data x sequence parallel layouts."""

    def __init__(self, module: SequenceParallelBase, spanning: list[SpanningPair], world: int):
        self.module, self.world = module, world
        self.spanning = [plan for plan in spanning if len(plan.group) > 1 or plan.self_cross]
        self.gathered: list[torch.Tensor] = []

    def _wanted(self, plan: SpanningPair, causal: bool):
        """Members whose rows this rank's queries attend: all others, or only earlier ones if causal and the
        members are in sequence order (contiguous; under zigzag every member holds earlier rows)."""
        causal = causal and plan.ordered
        return [j for j in range(len(plan.group)) if j != plan.index and (not causal or j < plan.index)]

    def _exchange(self, plan: SpanningPair, sends: list, receives: list, tag: int, phase: str) -> None:
        """Send sends[j] to member j and receive receives[j] from member j, for every other member j."""
        others = [(j, member) for j, member in enumerate(plan.group) if j != plan.index]
        module = self.module
        sends, receives = ({member: x[j] for j, member in others} for x in (sends, receives))
        exchange(sends, receives, module.process_group, module.stats, tag, phase)

    def _all_gather(self, plan: SpanningPair, mine: torch.Tensor) -> torch.Tensor:
        """Every member's buffer (all of mine's size), member after member."""
        g, width = len(plan.group), mine.numel()
        gathered = mine.new_empty(g * width)
        if width == 0:  # no member keeps a row (r > L): every member knows it, nothing to move
            return gathered
        if g == self.world:
            dist.all_gather_single(gathered, mine, group=self.module.process_group)
            moved = (g - 1) * tensor_bytes(mine)  # what the collective sends and receives of the tensors it was given
            self.module.stats.add("forward", moved, moved)
        else:
            slots = list(gathered.split(width))
            slots[plan.index].copy_(mine)
            self._exchange(plan, [mine] * g, slots, TAG_GATHER, "forward")
        return gathered

    def _reduce_scatter(self, plan: SpanningPair, shares: torch.Tensor) -> torch.Tensor:
        """The sum over members of their shares[my slot] (shares: one equal slot per member)."""
        g = len(plan.group)
        width = shares.numel() // g
        if width == 0:
            return shares
        if g == self.world:
            mine = shares.new_empty(width)
            dist.reduce_scatter_single(mine, shares, group=self.module.process_group)
            moved = (g - 1) * tensor_bytes(mine)
            self.module.stats.add("backward", moved, moved)
        else:
            received = shares.new_empty(g, width)
            received[plan.index].copy_(shares[plan.index * width : (plan.index + 1) * width])
            self._exchange(plan, list(shares.split(width)), list(received.unbind(0)), TAG_SCATTER, "backward")
            mine = received.sum(0)
        return mine

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        batch, head_dim = q.shape[0], q.shape[-1]
        with_mask = key_pad is not None
        self.gathered = []
        for plan in self.spanning:
            attend_own(attention, plan, q, k, v, key_pad, out, lse)
            sizes = [plan.elements(j, batch, head_dim, with_mask) for j in range(len(plan.group))]
            width = max(sizes)
            mine = torch.zeros(width, dtype=k.dtype, device=k.device)
            mine[: sizes[plan.index]] = plan.pack(k, v, key_pad)
            gathered = self._all_gather(plan, mine)
            self.gathered.append(gathered)
            for j in self._wanted(plan, attention.call.causal):
                rows = plan.unpack(j, gathered[j * width : j * width + sizes[j]], batch, head_dim, with_mask)
                attend_member(attention, plan, j, rows, q, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads: list) -> None:
        dq, dk, dv = grads
        batch, head_dim = q.shape[0], q.shape[-1]
        with_mask = key_pad is not None
        for plan, gathered in zip(self.spanning, self.gathered):
            attend_own_backward(attention, plan, dout, q, k, v, out, lse, key_pad, grads)
            g = len(plan.group)
            sizes = [plan.elements(j, batch, head_dim, with_mask) for j in range(g)]
            grad_sizes = [plan.elements(j, batch, head_dim, False) for j in range(g)]
            width, grad_width = max(sizes), max(grad_sizes)
            shares = k.new_zeros(g * grad_width)
            for j in self._wanted(plan, attention.call.causal):
                rows = plan.unpack(j, gathered[j * width : j * width + sizes[j]], batch, head_dim, with_mask)
                parts = attend_member_backward(attention, plan, j, rows, dout, q, out, lse, dq)
                shares[j * grad_width : j * grad_width + grad_sizes[j]] = plan.pack_grads(parts, k)
            mine = self._reduce_scatter(plan, shares)
            add_home_shares(attention, plan, mine[: grad_sizes[plan.index]], dk, dv, batch, head_dim)


class DistributedImprovedDilatedAttention(SequenceParallelBase):
    """Sequence-parallel dilated attention, the paper's way: all-gather sparsified K/V per segment group."""

    exchange_class = AllGatherExchange
    strategy_summary = "sparsified K/V all-gathered within each segment's ranks, dK/dV reduce-scattered"
