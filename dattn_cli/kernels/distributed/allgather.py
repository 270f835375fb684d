"""The LongNet paper's distributed algorithm: sparsify K/V locally, all-gather them within each
segment's rank group, attend local queries to every member's rows; backward reduce-scatters the dK/dV
shares so each rank receives the sum of the shares of its own rows. Queries and outputs stay local.

All-gather needs equal sizes: when ranks of a group keep different numbers of rows (L not divisible
by r), every buffer is padded to the largest; the byte counts include the padding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..engine import BlockAttention
from .sequence_parallel import (
    SequenceParallelBase,
    SpanningPair,
    add_home_shares,
    attend_member,
    attend_member_backward,
)


class AllGatherExchange:
    """RemoteBlocks of the all-gather strategy; keeps the gathered rows for its backward."""

    def __init__(self, module: SequenceParallelBase, spanning: list[SpanningPair], world: int):
        self.module = module
        groups = [module.subgroup(plan, world) for plan in spanning]  # also where this rank is alone
        self.spanning = [plan for plan in spanning if len(plan.group) > 1]
        self.groups = [group for group in groups if group is not None]
        self.gathered: list[torch.Tensor] = []

    def _wanted(self, plan: SpanningPair, causal: bool):
        """Members whose rows this rank's queries attend: all others, or only earlier ones if causal."""
        return [j for j in range(len(plan.group)) if j != plan.index and (not causal or j < plan.index)]

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        batch, head_dim = q.shape[0], q.shape[-1]
        with_mask = key_pad is not None
        self.gathered = []
        for plan, group in zip(self.spanning, self.groups):
            g = len(plan.group)
            sizes = [plan.elements(j, batch, head_dim, with_mask) for j in range(g)]
            width = max(sizes)
            mine = torch.zeros(width, dtype=k.dtype, device=k.device)
            mine[: sizes[plan.index]] = plan.pack(k, v, key_pad)
            gathered = k.new_empty(g * width)
            dist.all_gather_single(gathered, mine, group=group)
            moved = (g - 1) * width * k.element_size()
            self.module.stats.add("forward", moved, moved)
            self.gathered.append(gathered)
            for j in self._wanted(plan, attention.call.causal):
                rows = plan.unpack(j, gathered[j * width : j * width + sizes[j]], batch, head_dim, with_mask)
                attend_member(attention, plan, j, rows, q, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads: list) -> None:
        dq, dk, dv = grads
        batch, head_dim = q.shape[0], q.shape[-1]
        with_mask = key_pad is not None
        for plan, group, gathered in zip(self.spanning, self.groups, self.gathered):
            g = len(plan.group)
            sizes = [plan.elements(j, batch, head_dim, with_mask) for j in range(g)]
            grad_sizes = [plan.elements(j, batch, head_dim, False) for j in range(g)]
            width, grad_width = max(sizes), max(grad_sizes)
            shares = k.new_zeros(g * grad_width)
            for j in self._wanted(plan, attention.call.causal):
                rows = plan.unpack(j, gathered[j * width : j * width + sizes[j]], batch, head_dim, with_mask)
                parts = attend_member_backward(attention, plan, j, rows, dout, q, out, lse, dq)
                shares[j * grad_width : j * grad_width + grad_sizes[j]] = plan.pack_grads(parts, k)
            mine = k.new_empty(grad_width)
            dist.reduce_scatter_single(mine, shares, group=group)
            moved = (g - 1) * grad_width * k.element_size()
            self.module.stats.add("backward", moved, moved)
            add_home_shares(attention, plan, mine[: grad_sizes[plan.index]], dk, dv, batch, head_dim)


class DistributedImprovedDilatedAttention(SequenceParallelBase):
    """Sequence-parallel dilated attention, the paper's way: all-gather sparsified K/V per segment group."""

    exchange_class = AllGatherExchange
    strategy_summary = "sparsified K/V all-gathered within each segment's ranks, dK/dV reduce-scattered"
