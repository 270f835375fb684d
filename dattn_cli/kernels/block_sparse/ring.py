"""The ring form of block-sparse attention (attention.py): which key blocks each rank computes,
sends and receives, and the exchange that moves them.

A process group of p ranks: rank a holds the contiguous query and key blocks [a·L/b, (a+1)·L/b)
(L = N/p, b = block_size, L % b == 0), or under the zigzag layout (distributed/layout.py) the blocks of
chunks a and 2p-1-a of 2p (L/2 % b == 0), in that order. Every rank knows the table, so each knows which of its key
blocks every other rank's queries use: it sends exactly those (K, V and the key mask rows) and
receives exactly the blocks its own queries use — no transfer for a block no local query attends.
Transfers are posted before the local blocks are computed. Backward sends each received block's
dK/dV share home. With one rank the plan is all local parts and nothing travels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..distributed.comm import CommStats
from ..distributed.exchange import exchange, pack_rows, packed_elements, unpack_rows
from ..distributed.layout import chunk_count, rank_chunks
from ..engine import BlockAttention
from ..heads import KVHeadSet, heads_first
from .gather import Part, _block_rows, attend_parts, attend_parts_backward, plan_parts

TAG_KV, TAG_HOME = 21, 22


@dataclass(frozen=True)
class RankPlan:
    """What one rank computes and exchanges for one (shape, pattern, causal) call."""

    local: tuple[Part, ...]  # against this rank's own key blocks
    remote: dict[int, tuple[Part, ...]]  # source rank -> parts against the blocks received from it
    receive: dict[int, tuple[int, ...]]  # source rank -> its global key blocks this rank's queries use
    send: dict[int, torch.Tensor]  # destination rank -> local rows of this rank's blocks it uses


def owned_blocks(num_blocks: int, seq_len: int, block_size: int, world: int, layout: str) -> list[list[int]]:
    """Per rank, the global blocks it holds, in the order of its rows (its chunks' blocks, layout.py)."""
    chunks = chunk_count(world, layout)
    per_chunk = -(-(seq_len // chunks) // block_size)
    blocks = lambda c: range(c * per_chunk, min((c + 1) * per_chunk, num_blocks))  # noqa: E731
    return [[b for c in rank_chunks(r, world, layout) for b in blocks(c)] for r in range(world)]


def plan_rank(
    table: torch.Tensor,
    seq_len: int,
    block_size: int,
    rank: int,
    world: int,
    causal: bool,
    device: torch.device,
    layout: str = "contiguous",
) -> RankPlan:
    shard = seq_len // world
    owned = owned_blocks(table.shape[0], seq_len, block_size, world, layout)
    allowed = table.tril() if causal else table

    def used(by: int, of: int) -> tuple[int, ...]:
        rows = allowed[owned[by]][:, owned[of]]
        return tuple(owned[of][j] for j in rows.any(dim=0).nonzero().flatten().tolist())

    mine = owned[rank]
    local = plan_parts(table, mine, shard, mine, shard, block_size, causal, device)
    receive, remote, send = {}, {}, {}
    for other in range(world):
        if other == rank:
            continue
        if blocks := used(rank, other):
            receive[other] = blocks
            rows = len(blocks) * block_size
            remote[other] = plan_parts(
                table, mine, shard, blocks, rows, block_size, causal, device, source_id=2 + other
            )
        if blocks := used(other, rank):
            where = {g: i for i, g in enumerate(mine)}
            rows = [torch.arange(*_block_rows(where[g], block_size, shard)) for g in blocks]
            send[other] = torch.cat(rows).to(device)
    return RankPlan(tuple(local), remote, receive, send)


class BlockSparseExchange:
    """KeyBlockExecutor (engine.py) of the block-sparse module: the rank's own key blocks, then the key blocks
    received from other ranks (ring form). Kept from forward to backward: the received blocks."""

    def __init__(self, plan: RankPlan, block_size: int, group, stats: CommStats, kv_group: int = 1):
        self.plan, self.block_size, self.group, self.stats = plan, block_size, group, stats
        self.kv_group = kv_group  # GQA: K/V and their shares travel at the kv heads (kernels/heads.py)
        self.received: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def _post(self, sends: dict[int, torch.Tensor], receives: dict[int, torch.Tensor], tag: int, phase: str):
        return exchange(sends, receives, self.group, self.stats, tag, phase, wait=False)

    def _heads(self, heads: int) -> KVHeadSet:
        return KVHeadSet(0, 1, heads, self.kv_group)

    def _pack(self, rows: torch.Tensor, k, v, key_pad) -> torch.Tensor:
        """K and V rows at the kv heads (heads first, as the receiver attends them) and the key-mask rows."""
        kv = self._heads(k.shape[1])
        mask = None if key_pad is None else key_pad.index_select(1, rows)
        return pack_rows(kv.pack(k.index_select(2, rows), 1), kv.pack(v.index_select(2, rows), 1), mask)

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        batch, _, heads, head_dim = k.shape
        kv = self._heads(heads)
        q, k, v = (heads_first(x) for x in (q, k, v))
        buffers = {}
        for src, blocks in self.plan.receive.items():
            rows = len(blocks) * self.block_size
            buffers[src] = k.new_empty(packed_elements(batch, kv.kv_count, head_dim, rows, key_pad is not None))
        sends = {dst: self._pack(rows, k, v, key_pad) for dst, rows in self.plan.send.items()}
        works = self._post(sends, buffers, TAG_KV, "forward")
        attend_parts(attention, self.plan.local, q, k, v, key_pad, out, lse)  # while the blocks travel
        for work in works:
            work.wait()
        for src, buf in buffers.items():
            rows = len(self.plan.receive[src]) * self.block_size
            mask = (batch, rows) if key_pad is not None else None
            kr, vr, pad = unpack_rows(buf, (batch, kv.kv_count, rows, head_dim), mask)
            self.received[src] = (kr, vr, pad)  # kept at the kv heads, repeated again in backward
            attend_parts(attention, self.plan.remote[src], q, kv.unpack(kr, 1), kv.unpack(vr, 1), pad, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads) -> None:
        batch, _, heads, head_dim = k.shape
        kv = self._heads(heads)
        dout, q, k, v, out, lse = (heads_first(x) for x in (dout, q, k, v, out, lse))
        acc = grads[0].dtype
        dq, dk, dv = (g.transpose(1, 2) for g in grads)  # the engine's (B, N, H, D) accumulators, heads first
        shares = {}
        for src, (kr, vr, pad) in self.received.items():  # remote shares first, so they travel during local work
            kr, vr = kv.unpack(kr, 1), kv.unpack(vr, 1)
            dkr, dvr = (
                torch.zeros(kr.shape, dtype=acc, device=kr.device),
                torch.zeros(vr.shape, dtype=acc, device=vr.device),
            )
            attend_parts_backward(attention, self.plan.remote[src], dout, q, out, lse, kr, vr, pad, dq, dkr, dvr)
            shares[src] = pack_rows(kv.reduce(dkr, 1), kv.reduce(dvr, 1))
        home = {
            dst: dk.new_empty(packed_elements(batch, kv.kv_count, head_dim, rows.numel()))
            for dst, rows in self.plan.send.items()
        }
        works = self._post(shares, home, TAG_HOME, "backward")
        attend_parts_backward(attention, self.plan.local, dout, q, out, lse, k, v, key_pad, dq, dk, dv)
        for work in works:
            work.wait()
        for dst, buf in home.items():
            rows = self.plan.send[dst]
            dk_home, dv_home, _ = unpack_rows(buf, (batch, kv.kv_count, rows.numel(), head_dim))
            dk.index_add_(2, rows, kv.place(dk_home, 1))
            dv.index_add_(2, rows, kv.place(dv_home, 1))
        self.received.clear()
