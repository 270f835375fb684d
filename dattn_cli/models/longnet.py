"""LongNet building blocks: a dilated transformer block and a small decoder-only language model.

DilatedTransformerBlock: x + Attn(LN(x)), then x + MLP(LN(x)) ("pre" norm), or the MAGNETO layout
("subln": Wang et al., "Foundation Transformers", 2022 — an extra LayerNorm inside each sublayer, before
the attention output projection and before the MLP's second linear, with Xavier gain gamma on the
value/output and MLP weights). The attention is any registered multihead implementation, by name, with
rotary position embeddings so the model works at any length.

LongNetLM: token embedding, blocks, final LayerNorm, output head tied to the embedding. Per-block
gradient checkpointing (`checkpointing=True`, torch.utils.checkpoint, non-reentrant) and autocast
(run the forward under `torch.autocast`) are supported; causal attention throughout.

Sequence parallelism: with a distributed attention (`attention="RingMultiheadDilatedAttention",
process_group=sp_group`, ...) each rank passes its contiguous shard of the sequence, and the rotary positions
of a shard start where the shard starts in the whole sequence, so the shards' logits and summed gradients are
those of the whole sequence on one process. By default that start is `rank_in_group * shard_len` (equal
shards, in rank order: what the distributed attention classes assume); `forward(tokens, position_offset=s)`
gives it explicitly for any other layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..kernels.distributed.comm import group_rank_size
from ..kernels.registry import REGISTRY, create_multihead_dilated_attention

NORMS = ("pre", "subln")


def shard_start(attention: nn.Module, shard_len: int) -> int:
    """Where a rank's shard of `shard_len` tokens starts in the whole sequence, for a multihead attention module:
    rank_in_group * shard_len when its core shards the sequence over its process group (the default group when
    that is None, as the distributed classes do: equal contiguous shards in rank order), else 0."""
    core = attention.attention
    if not hasattr(core, "process_group"):  # a single-device core: the whole sequence is here
        return 0
    return group_rank_size(core.process_group)[0] * shard_len


class DilatedTransformerBlock(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        attention: str = "ImprovedMultiheadDilatedAttention",
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        norm: str = "pre",
        num_layers: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **attention_options,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is unknown: use 'pre' (pre-LayerNorm) or 'subln' (MAGNETO sub-LayerNorm)")
        if attention not in REGISTRY or REGISTRY[attention].kind != "multihead":
            names = ", ".join(n for n, i in REGISTRY.items() if i.kind == "multihead")
            raise ValueError(
                f"attention={attention!r} is not a registered multihead implementation: use one of {names}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        factory = {"device": device, "dtype": dtype}
        self.norm_kind = norm
        # MAGNETO's gain for decoder-only models: sqrt(log(2N)) for N layers
        gamma = math.sqrt(math.log(2 * num_layers)) if norm == "subln" and num_layers > 1 else 1.0
        hidden = int(embed_dim * mlp_ratio)
        self.attn_norm = nn.LayerNorm(embed_dim, **factory)
        self.attn = create_multihead_dilated_attention(
            attention,
            embed_dim=embed_dim,
            num_heads=num_heads,
            segment_lengths=segment_lengths,
            dilation_rates=dilation_rates,
            dropout=dropout,
            layer_norm=norm == "subln",
            gamma_init=gamma,
            rotary=True,
            **factory,
            **attention_options,
        )
        self.mlp_norm = nn.LayerNorm(embed_dim, **factory)
        self.fc1 = nn.Linear(embed_dim, hidden, **factory)
        self.mlp_inner_norm = nn.LayerNorm(hidden, **factory) if norm == "subln" else None
        self.fc2 = nn.Linear(hidden, embed_dim, **factory)
        self.dropout = nn.Dropout(dropout)
        for fc in (self.fc1, self.fc2):  # zeros_ draws no random numbers: as if both weights were drawn first
            nn.init.xavier_normal_(fc.weight, gain=gamma)
            nn.init.zeros_(fc.bias)

    def forward(
        self,
        x: torch.Tensor,
        is_causal: bool = True,
        position_offset: int | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (batch, seq_len, embed_dim) -> same shape. position_offset: the position of x[:, 0] in the whole
        sequence, for the rotary embeddings; None: this rank's shard start (`shard_start`). cu_seqlens: packed
        documents of the whole sequence (batch 1), each attended on its own (kernels/documents.py)."""
        if position_offset is None:
            position_offset = shard_start(self.attn, x.shape[1])
        h = self.attn_norm(x)
        documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        x = x + self.dropout(self.attn(h, h, h, is_causal=is_causal, position_offset=position_offset, **documents)[0])
        h = F.gelu(self.fc1(self.mlp_norm(x)))
        if self.mlp_inner_norm is not None:
            h = self.mlp_inner_norm(h)
        return x + self.dropout(self.fc2(h))


class LongNetLM(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        num_heads: int,
        num_layers: int,
        *,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        attention: str = "ImprovedMultiheadDilatedAttention",
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        norm: str = "pre",
        checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **attention_options,
    ):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.embed = nn.Embedding(vocab_size, embed_dim, device=device, dtype=dtype)
        nn.init.normal_(self.embed.weight, std=embed_dim**-0.5)
        self.blocks = nn.ModuleList(
            DilatedTransformerBlock(
                embed_dim,
                num_heads,
                segment_lengths=segment_lengths,
                dilation_rates=dilation_rates,
                attention=attention,
                mlp_ratio=mlp_ratio,
                dropout=dropout,
                norm=norm,
                num_layers=num_layers,
                device=device,
                dtype=dtype,
                **attention_options,
            )
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(embed_dim, device=device, dtype=dtype)
        self.checkpointing = bool(checkpointing)
        self.scale = embed_dim**0.5

    def forward(
        self, tokens: torch.Tensor, position_offset: int | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens (batch, seq_len) int64 -> logits (batch, seq_len, vocab_size); causal.

        Under sequence parallelism `tokens` is this rank's shard; position_offset is the position of
        tokens[:, 0] in the whole sequence, by default `shard_start(seq_len)` (0 on one process). cu_seqlens:
        packed documents (batch 1; the whole sequence's boundaries on every rank): each one as if alone."""
        if tokens.dtype != torch.long or tokens.dim() != 2:
            raise ValueError(f"tokens must be int64 (batch, seq_len), got {tokens.dtype} {tuple(tokens.shape)}")
        if position_offset is None:
            position_offset = self.shard_start(tokens.shape[1])
        elif isinstance(position_offset, bool) or not isinstance(position_offset, int) or position_offset < 0:
            raise ValueError(
                f"position_offset must be a non-negative integer, got {position_offset!r}: pass the "
                "position of tokens[:, 0] in the whole sequence, or None for this rank's shard start"
            )
        x = self.embed(tokens) * self.scale
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, True, position_offset, cu_seqlens, use_reentrant=False)
            else:
                x = block(x, True, position_offset, cu_seqlens)
        return F.linear(self.final_norm(x), self.embed.weight)  # head tied to the embedding

    def shard_start(self, shard_len: int) -> int:
        """Where this rank's shard of `shard_len` tokens starts in the whole sequence (module-level shard_start)."""
        return shard_start(self.blocks[0].attn, shard_len)

    def loss(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int = -100,
        position_offset: int | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean cross-entropy of the logits of `tokens` (position_offset, cu_seqlens as in forward) against
        `targets`."""
        logits = self(tokens, position_offset, cu_seqlens)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)
