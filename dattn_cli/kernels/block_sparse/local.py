"""The single-device block executor of block-sparse attention (attention.py): the gather executor's calls
(gather.py) for every key block of the table, as the engine's KeyBlockExecutor. Nothing travels; the ring
form (ring.py) runs the same calls on a rank's own blocks and adds the blocks received from other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine import BlockAttention
from ..heads import heads_first
from .gather import Part, attend_parts, attend_parts_backward, coalesce, plan_parts


def plan_local(
    table: torch.Tensor, seq_len: int, block_size: int, causal: bool, device: torch.device
) -> tuple[Part, ...]:
    """The backend calls of the whole table on one device: every query block against every key block."""
    blocks = range(table.shape[0])
    return plan_parts(table, blocks, seq_len, blocks, seq_len, block_size, causal, device)


@dataclass(frozen=True)
class LocalBlocks:
    """KeyBlockExecutor (engine.py) of one device: the planned calls on q, k, v copied heads-first once, so
    each call reads contiguous rows; out, lse and the gradients are the engine's accumulators."""

    parts: tuple[Part, ...]
    coalesced: tuple[Part, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "coalesced", coalesce(self.parts))

    def calls(self, attention: BlockAttention) -> tuple[Part, ...]:
        """The parts as planned under dropout (a stream per query block), else coalesced."""
        return self.parts if attention.call.dropout_p > 0 else self.coalesced

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        q, k, v = (heads_first(x) for x in (q, k, v))
        attend_parts(attention, self.calls(attention), q, k, v, key_pad, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads) -> None:
        dout, q, k, v, out, lse = (heads_first(x) for x in (dout, q, k, v, out, lse))
        dq, dk, dv = (g.transpose(1, 2) for g in grads)  # the engine's (B, N, H, D) accumulators, heads first
        attend_parts_backward(attention, self.calls(attention), dout, q, out, lse, k, v, key_pad, dq, dk, dv)
