"""The ring form of the sliding window: each rank holds a contiguous shard of L positions and needs the keys
`left` positions before it (and, non-causal, `right` after it): those halo rows come point-to-point from the
ranks that hold them (K, V at the kv heads, and the key mask), and backward sends their dK/dV home.

A window wider than a shard takes rows from several ranks; a rank never receives a row its queries do not
use. Bytes per rank: the halo rows it receives, (left + right) · B · 2 · H_kv · D · e at most, forward; the
same back as gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..distributed.comm import CommStats
from ..distributed.exchange import exchange, pack_rows, packed_elements, unpack_rows

TAG_HALO, TAG_HALO_GRAD = 41, 42


@dataclass(frozen=True)
class HaloPlan:
    """Global row ranges [lo, hi) this rank receives from each lower / higher rank, and sends to each rank."""

    start: int  # the global position of this rank's first row
    receive: tuple[tuple[int, int, int], ...]  # (rank, lo, hi), in position order
    send: tuple[tuple[int, int, int], ...]

    @property
    def before(self) -> int:
        """Halo rows in front of the shard (the extended keys start at start - before)."""
        return sum(hi - lo for _, lo, hi in self.receive if lo < self.start)


def plan_halo(rank: int, world: int, shard: int, left: int, reach: int) -> HaloPlan:
    def needed(r: int) -> tuple[int, int]:
        return max(0, r * shard - left), min(world * shard, (r + 1) * shard + reach)

    def overlap(r: int, lo: int, hi: int) -> tuple[int, int] | None:
        a, b = max(lo, r * shard), min(hi, (r + 1) * shard)
        return (a, b) if a < b else None

    receive, send = [], []
    for other in range(world):
        if other == rank:
            continue
        if got := overlap(other, *needed(rank)):
            receive.append((other, *got))
        if given := overlap(rank, *needed(other)):
            send.append((other, *given))
    return HaloPlan(rank * shard, tuple(receive), tuple(send))


class HaloExchange(torch.autograd.Function):
    """(k, v, key_pad) of the shard -> (k, v, key_pad) extended by the halo rows (the mask not differentiable)."""

    @staticmethod
    def forward(ctx, k, v, key_pad, plan: HaloPlan, group, stats: CommStats):
        ctx.plan, ctx.group, ctx.stats, ctx.shape = plan, group, stats, k.shape
        masked = key_pad is not None
        own = lambda x, lo, hi: None if x is None else x[:, lo - plan.start : hi - plan.start]  # noqa: E731
        sends = {r: pack_rows(own(k, lo, hi), own(v, lo, hi), own(key_pad, lo, hi)) for r, lo, hi in plan.send}
        batch, _, heads, head_dim = k.shape
        receives = {
            r: k.new_empty(packed_elements(batch, heads, head_dim, hi - lo, masked)) for r, lo, hi in plan.receive
        }
        exchange(sends, receives, group, stats, TAG_HALO, "forward")
        parts = {
            r: unpack_rows(receives[r], (batch, hi - lo, heads, head_dim), (batch, hi - lo) if masked else None)
            for r, lo, hi in plan.receive
        }
        before = [parts[r] for r, lo, _ in plan.receive if lo < plan.start]
        after = [parts[r] for r, lo, _ in plan.receive if lo >= plan.start]
        local = (k, v, key_pad)
        ext = [
            torch.cat([p[i] for p in before] + [local[i]] + [p[i] for p in after], 1) if i < 2 or masked else None
            for i in range(3)
        ]
        if ext[2] is not None:
            ctx.mark_non_differentiable(ext[2])
        return tuple(ext)

    @staticmethod
    def backward(ctx, dk_ext, dv_ext, _dpad):
        plan, length = ctx.plan, ctx.shape[1]
        at, homes = 0, {}
        for r, lo, hi in plan.receive:  # halo gradients go home, in the order the rows were laid out
            if lo >= plan.start and at < plan.before + length:
                at = plan.before + length
            homes[r] = pack_rows(dk_ext[:, at : at + hi - lo], dv_ext[:, at : at + hi - lo])
            at += hi - lo
        dk = dk_ext[:, plan.before : plan.before + length].clone()
        dv = dv_ext[:, plan.before : plan.before + length].clone()
        batch, _, heads, head_dim = dk.shape
        shares = {r: dk.new_empty(packed_elements(batch, heads, head_dim, hi - lo)) for r, lo, hi in plan.send}
        exchange(homes, shares, ctx.group, ctx.stats, TAG_HALO_GRAD, "backward")
        for r, lo, hi in plan.send:
            rows = slice(lo - plan.start, hi - plan.start)
            dk_home, dv_home, _ = unpack_rows(shares[r], (batch, hi - lo, heads, head_dim))
            dk[:, rows] += dk_home
            dv[:, rows] += dv_home
        return dk, dv, None, None, None, None
