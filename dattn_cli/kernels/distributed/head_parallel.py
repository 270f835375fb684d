"""Head-parallel (Ulysses-style) dilated attention.

Each rank holds a contiguous sequence shard (B, N/p, H, D). An all-to-all turns sequence shards into
head shards (B, N, H/p, D); each rank runs full dilated attention on its H/p heads (offsets and head
groups by global head index); a second all-to-all turns the result back into sequence shards.

Communication per forward, per rank (e = bytes per element, p ranks): q, k, v and the output each move
(p-1)/p of the shard: 4 * B * (N/p) * H * D * e * (p-1)/p bytes sent and as many received; the backward
moves the same four tensors' gradients the other way (see docs/communication.md). GQA: k and v move at
lcm(H_kv, p) heads (H_kv when p divides it; kv heads repeated when there are more ranks than kv heads).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..documents import document_spans
from ..heads import expand_kv, kv_group
from .comm import CommStats, DistributedAttention, check_call, group_rank_size
from .documents import check_documents


def _payload(t: torch.Tensor, world: int) -> int:
    return t.numel() * t.element_size() * (world - 1) // world


class _AllToAll(torch.autograd.Function):
    """all_to_all_single between the sequence-sharded and head-sharded layouts; each is the other's backward."""

    @staticmethod
    def forward(ctx, x, to_heads: bool, group, stats: CommStats):
        ctx.to_heads, ctx.group, ctx.stats = to_heads, group, stats
        return _exchange(x, to_heads, group, stats, "forward")

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad.contiguous(), not ctx.to_heads, ctx.group, ctx.stats, "backward"), None, None, None


def _exchange(x: torch.Tensor, to_heads: bool, group, stats: CommStats, phase: str) -> torch.Tensor:
    _, world = group_rank_size(group)
    if to_heads:  # (B, L, H, D) -> (B, p*L, H/p, D)
        b, length, h, d = x.shape
        send = x.view(b, length, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
    else:  # (B, N, H/p, D) -> (B, N/p, H, D)
        b, n, hp, d = x.shape
        send = x.view(b, world, n // world, hp, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    stats.add(phase, _payload(send, world), _payload(recv, world))
    if to_heads:  # recv[i] = rank i's sequence shard of my heads
        return recv.permute(1, 0, 2, 3, 4).reshape(b, world * length, h // world, d)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, n // world, world * hp, d)  # recv[i] = my shard of head chunk i


def spread_kv_heads(k: torch.Tensor, v: torch.Tensor, heads: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GQA: K/V with H_kv heads as lcm(H_kv, p) heads (each kv head repeated as often as needed), so that the
    all-to-all hands every rank the kv heads of its H/p query heads; as they are when p divides H_kv."""
    kv_group(heads, k.shape[2])
    return expand_kv(k, v, math.lcm(k.shape[2], world))  # lcm divides H: p and H_kv both do


class HeadParallelDilatedAttention(DistributedAttention):
    """Sequence-sharded in, sequence-sharded out; dilated attention on H/p heads per rank in between."""

    def _distributed(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse, rank, world):
        """Moving lse back costs one more all-to-all (counted), made only for forward_with_lse. cu_seqlens: packed
        documents of the whole sequence: after the all-to-all every rank holds whole documents of its heads."""
        batch, length, heads, _ = q.shape
        if heads % world:
            raise ValueError(
                f"HeadParallelDilatedAttention: {heads} heads cannot be split over {world} ranks; "
                "use a head count divisible by the world size, or a sequence-parallel implementation"
            )
        k, v = spread_kv_heads(k, v, heads, world)
        check_call(self, q, k, is_causal, key_padding_mask, cu_seqlens is not None)
        if cu_seqlens is not None:
            check_documents(
                self.process_group, type(self).__name__, document_spans(cu_seqlens, length * world, batch), q.device
            )
        self.stats.call()
        group, stats = self.process_group, self.stats
        qh, kh, vh = (_AllToAll.apply(x, True, group, stats) for x in (q, k, v))
        full_mask = None
        if key_padding_mask is not None:  # every rank needs the whole (B, N) mask
            parts = [torch.empty_like(key_padding_mask) for _ in range(world)]
            dist.all_gather(parts, key_padding_mask.contiguous(), group=group)
            full_mask = torch.cat(parts, dim=1)
            mask_bytes = key_padding_mask.numel() * key_padding_mask.element_size() * (world - 1)
            stats.add("forward", mask_bytes, mask_bytes)
        out, lse = self.attention.forward_with_lse(
            qh,
            kh,
            vh,
            is_causal,
            key_padding_mask=full_mask,
            head_range=(rank * (heads // world), heads),
            cu_seqlens=cu_seqlens,
        )
        out = _AllToAll.apply(out.contiguous(), False, group, stats)
        if need_lse:
            lse = _exchange(lse.unsqueeze(-1).contiguous(), False, group, stats, "forward").squeeze(-1)
        return out, lse if need_lse else None

    def describe(self) -> str:
        rank, world = group_rank_size(self.process_group)
        return (
            f"HeadParallelDilatedAttention over {world} rank(s) (all-to-all seq<->heads); inner: "
            + self.attention.describe()
        )
