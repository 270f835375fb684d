"""nn.MultiheadAttention-style modules around the dilated attention cores.

One input projection weight (E + 2·E_kv, E), E_kv = num_kv_heads · head_dim (= E without GQA):
self-attention (query is key is value) runs it as one fused matmul; otherwise its q/k/v slices project
each input separately. num_kv_heads < num_heads: grouped-query attention (MQA at 1), kernels/heads.py. Optional
MAGNETO sub-LayerNorm before
the output projection; Xavier-normal init with the MAGNETO gain `gamma_init` on the value and output
projections (Wang et al., "Foundation Transformers", 2022).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .block_sparse.attention import BlockSparseRingDilatedAttention
from .dilated import DilatedAttention, ImprovedDilatedAttention
from .distributed.allgather import DistributedImprovedDilatedAttention
from .distributed.comm import group_rank_size
from .distributed.head_parallel import HeadParallelDilatedAttention
from .distributed.hybrid import HybridDilatedAttention
from .distributed.layout import DOCUMENTS, rank_positions
from .distributed.ring import RingDilatedAttention
from .heads import divisors
from .rotary import apply_rotary, document_positions


def shard_positions(attention: nn.Module, length: int, device) -> torch.Tensor:
    """float64 global positions of this rank's `length` rows under its core's layout (distributed/layout.py)."""
    rank_world = getattr(attention, "rank_world", None)  # a hybrid's rank among its p ranks, not its head group's
    rank, world = rank_world() if rank_world else group_rank_size(attention.process_group)
    if attention.layout == DOCUMENTS:
        raise ValueError(
            "rotary embeddings are not supported with layout='documents' (the rows' positions depend on the "
            "documents): use rotary=False, or layout='contiguous' for packed documents with rotary"
        )
    return rank_positions(rank, world, length, attention.layout, device).double()


def _check_shape(embed_dim: int, num_heads: int, num_kv_heads: int | None, batch_first: bool, gamma_init: float) -> int:
    """ValueError naming the argument for what MultiheadDilatedAttention cannot take; the kv head count."""
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if embed_dim % num_heads:
        raise ValueError(
            f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}: choose embed_dim = num_heads * head_dim"
        )
    if not batch_first:
        raise ValueError("batch_first=False is not supported: pass (batch, seq_len, embed_dim) with batch_first=True")
    if gamma_init <= 0:
        raise ValueError(f"gamma_init must be positive, got {gamma_init!r}")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0 or num_heads % kv_heads:
        raise ValueError(
            f"num_kv_heads must divide num_heads={num_heads}, got {num_kv_heads!r}: use one of {divisors(num_heads)}"
        )
    return kv_heads


class MultiheadDilatedAttention(nn.Module):
    attention_class: type[nn.Module] = DilatedAttention

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        segment_lengths: Sequence[int] | None = None,
        dilation_rates: Sequence[int] | None = None,
        bias: bool = True,
        layer_norm: bool = True,
        layer_norm_eps: float = 1e-5,
        gamma_init: float = 1.0,
        batch_first: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        rotary: bool = False,
        num_kv_heads: int | None = None,
        **attention_options,
    ):
        """attention_options go to the core: semantics, scale, dropout, backend, use_pattern_cache,
        enable_memory_pool (every core's, same defaults), process_group for the distributed forms, pattern,
        block_size, window, density for the block-sparse form; a core that does not take one raises TypeError."""
        super().__init__()
        self.num_kv_heads = _check_shape(embed_dim, num_heads, num_kv_heads, batch_first, gamma_init)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.kv_dim = self.num_kv_heads * self.head_dim
        self.batch_first = True
        self.gamma_init = gamma_init
        self.rotary = bool(rotary)
        if self.rotary and self.head_dim % 2:
            raise ValueError(f"rotary=True needs an even head_dim, got {self.head_dim}: change embed_dim or num_heads")
        factory = {"device": device, "dtype": dtype}
        self.in_proj = nn.Linear(embed_dim, embed_dim + 2 * self.kv_dim, bias=bias, **factory)
        self.attention = self.attention_class(segment_lengths, dilation_rates, **attention_options)
        self.norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps, **factory) if layer_norm else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        e, kv = self.embed_dim, self.kv_dim
        with torch.no_grad():
            nn.init.xavier_normal_(self.in_proj.weight[:e])
            nn.init.xavier_normal_(self.in_proj.weight[e : e + kv])
            nn.init.xavier_normal_(self.in_proj.weight[e + kv :], gain=self.gamma_init)
            nn.init.xavier_normal_(self.out_proj.weight, gain=self.gamma_init)
            for lin in (self.in_proj, self.out_proj):
                if lin.bias is not None:
                    lin.bias.zero_()
        if self.norm is not None:
            self.norm.reset_parameters()

    def _project(self, query, key, value):
        sizes = (self.embed_dim, self.kv_dim, self.kv_dim)
        if query is key and key is value:
            return self.in_proj(query).split(sizes, dim=-1)
        w = self.in_proj.weight.split(sizes)
        b = self.in_proj.bias.split(sizes) if self.in_proj.bias is not None else (None, None, None)
        return tuple(F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), w, b))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        is_causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        attn_mask: torch.Tensor | None = None,
        position_offset: int = 0,
        seq_len: int | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, None]:
        """query, key, value: (batch, seq_len, embed_dim) -> (out (batch, seq_len, embed_dim), None).
        position_offset: the position of the first row (a sequence shard), for rotary embeddings; under a
        zigzag core (layout="zigzag") the rows' positions come from the layout, shifted by position_offset.
        seq_len: for a block-sparse core over shards that shard_sequence padded, the length before padding.
        cu_seqlens: packed documents (batch 1; the whole sequence's, on every rank), each attended on its own,
        rotary positions counted from each document's first token (kernels/documents.py)."""
        if attn_mask is not None:
            raise NotImplementedError(
                "attn_mask is not supported by dilated attention: use is_causal=True for causal masking "
                "and key_padding_mask for padded keys"
            )
        if need_weights:
            raise NotImplementedError(
                "need_weights=True is not supported: dilated attention never forms the weight matrix"
            )
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} has shape {shape}: pass (batch, seq_len, {self.embed_dim})")
        q, k, v = (x.unflatten(-1, (-1, self.head_dim)) for x in self._project(query, key, value))
        if self.rotary:
            positions = (
                None if cu_seqlens is None else document_positions(cu_seqlens, position_offset, q.shape[1], q.device)
            )
            if getattr(self.attention, "layout", "contiguous") != "contiguous":  # zigzag: the rows' own positions
                positions = shard_positions(self.attention, q.shape[1], q.device) + position_offset
            q, k = (apply_rotary(x, position_offset, positions=positions) for x in (q, k))
        # only the given ones: only block-sparse cores take seq_len
        real = {name: x for name, x in (("seq_len", seq_len), ("cu_seqlens", cu_seqlens)) if x is not None}
        out = self.attention(q, k, v, is_causal=is_causal, key_padding_mask=key_padding_mask, **real).flatten(2)
        if self.norm is not None:
            out = self.norm(out)
        return self.out_proj(out), None

    def describe(self) -> str:
        ln = "MAGNETO sub-LayerNorm" if self.norm is not None else "no sub-LayerNorm"
        return (
            f"{type(self).__name__}(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, {ln}) over " + self.attention.describe()
        )


class ImprovedMultiheadDilatedAttention(MultiheadDilatedAttention):
    attention_class = ImprovedDilatedAttention


class ShardedMultiheadDilatedAttention(MultiheadDilatedAttention):
    """Projections around a distributed core (process_group as a keyword): each rank passes its sequence
    shard (batch, N/p, embed_dim) and gets its output shard; the weights must be the same on every rank
    (as under DDP), and their gradients summed over the ranks (as DDP's all-reduce does)."""

    def comm_stats(self) -> dict[str, int]:
        return self.attention.comm_stats()


class RingMultiheadDilatedAttention(ShardedMultiheadDilatedAttention):
    """Projections around RingDilatedAttention."""

    attention_class = RingDilatedAttention


class DistributedImprovedMultiheadDilatedAttention(ShardedMultiheadDilatedAttention):
    """Projections around DistributedImprovedDilatedAttention (the all-gather form)."""

    attention_class = DistributedImprovedDilatedAttention


class HeadParallelMultiheadDilatedAttention(ShardedMultiheadDilatedAttention):
    """Projections around HeadParallelDilatedAttention (num_heads divisible by the group's size)."""

    attention_class = HeadParallelDilatedAttention


class HybridMultiheadDilatedAttention(ShardedMultiheadDilatedAttention):
    """Projections around HybridDilatedAttention (head_group=, ring_group= from hybrid_groups)."""

    attention_class = HybridDilatedAttention


class BlockSparseRingMultiheadDilatedAttention(RingMultiheadDilatedAttention):
    """Projections around BlockSparseRingDilatedAttention (pattern options as keywords; with a
    process_group, each rank passes its sequence shard)."""

    attention_class = BlockSparseRingDilatedAttention
