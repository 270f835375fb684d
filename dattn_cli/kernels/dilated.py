"""Single-device dilated attention modules.

DilatedAttention and ImprovedDilatedAttention compute the same function through the same engine;
they differ only in how they reach a block's rows and what they keep between calls:

* DilatedAttention: gathers kept rows into new tensors by index and scatters results back; plans the
  pattern on every call unless `use_pattern_cache=True`.
* ImprovedDilatedAttention: strided views of q, k, v and of the accumulators (no gather, in-place
  merge and gradient adds), the plan from the pattern cache, fp32 scratch from the memory pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .backends import BlockCall, check_backend, resolve_backend
from .cache import PatternCache, get_global_pattern_cache
from .chunks import SEQUENCE_CHUNK_ELEMENTS, ChunkedAttention, chunk_bounds, chunk_length
from .documents import attend_documents
from .engine import BlockAttention, IndexAccess, RowAccess, ViewAccess, block_attention
from .heads import expand_kv
from .pattern import Block, check_head_groups, pair_blocks, validate_pattern
from .pool import MemoryPool, get_global_memory_pool
from .reference import dilated_attention_reference
from .validation import check_key_padding_mask, check_qkv


class AttentionCore(nn.Module):
    """What every single-device core shares: scale, dropout, backend choice, pattern cache and memory
    pool options, and the per-call setup (`prepare_call`)."""

    default_pattern_cache = False
    default_memory_pool = False

    def __init__(
        self,
        *,
        scale: float | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        use_pattern_cache: bool | None = None,
        enable_memory_pool: bool | None = None,
    ):
        super().__init__()
        if scale is not None and (not isinstance(scale, (int, float)) or scale <= 0):
            raise ValueError(f"scale must be a positive number or None (= head_dim ** -0.5), got {scale!r}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        check_backend(backend, dropout_active=dropout > 0)
        self.scale = scale
        self.dropout = float(dropout)
        self.backend = backend
        self.use_pattern_cache = self.default_pattern_cache if use_pattern_cache is None else bool(use_pattern_cache)
        self.enable_memory_pool = self.default_memory_pool if enable_memory_pool is None else bool(enable_memory_pool)
        self.pattern_cache: PatternCache = get_global_pattern_cache()
        self.memory_pool: MemoryPool = get_global_memory_pool()
        self.last_backend: tuple[str, str] | None = None
        self.selection_reason: str | None = None

    # the state every rank of a distributed call must share (distributed/comm.py check_call)
    signature_fields = ("scale", "dropout", "training", "backend")

    def signature(self) -> str:
        """This module's own state as one string, field by field (`signature_fields`)."""
        return "|".join(f"{name}={getattr(self, name)}" for name in self.signature_fields)

    def cached(self, key, build):
        """`build()`, through the pattern cache when it is on for this module."""
        return self.pattern_cache.get_or_build(key, build) if self.use_pattern_cache else build()

    def prepare_call(self, q: torch.Tensor, is_causal: bool, masked: bool) -> tuple[str, BlockCall, MemoryPool | None]:
        """The backend for this call (recorded for describe()), the per-call options and the scratch pool."""
        dropout_active = self.training and self.dropout > 0
        backend, reason = resolve_backend(self.backend, q.device, q.dtype, dropout_active, masked, q.shape[-1])
        self.last_backend = (backend, reason)
        call = BlockCall(
            causal=bool(is_causal),
            scale=q.shape[-1] ** -0.5 if self.scale is None else float(self.scale),
            dropout_p=self.dropout if dropout_active else 0.0,
            seed=int(torch.randint(1 << 62, ()).item()) if dropout_active else 0,
        )
        return backend, call, self.memory_pool if self.enable_memory_pool else None

    def describe_backend(self) -> str:
        if self.last_backend:
            return f"backend {self.backend} -> {self.last_backend[0]} on the last call ({self.last_backend[1]})"
        return f"backend {self.backend} (resolved per call from device, dtype, dropout and masks)"


class _DilatedAttentionBase(AttentionCore):
    gathers_by_index = True
    signature_fields = (*AttentionCore.signature_fields, "segment_lengths", "dilation_rates", "semantics")

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        semantics: str = "longnet",
        sequence_chunk_elements: int | None = SEQUENCE_CHUNK_ELEMENTS,
        **core_options,  # AttentionCore's: scale, dropout, backend, use_pattern_cache, enable_memory_pool
    ):
        super().__init__(**core_options)
        self.segment_lengths, self.dilation_rates = validate_pattern(segment_lengths, dilation_rates, semantics)
        self.semantics = semantics
        # long calls run chunk by chunk of the sequence (kernels/chunks.py): same result, the engine's working set
        # sized by the chunk; None: one call over N
        self.sequence_chunk_elements = chunk = sequence_chunk_elements
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"sequence_chunk_elements must be a positive int or None (one call over N), got {chunk!r}")

    # planning ---------------------------------------------------------------------------------
    def _plan_pair(self, pair: int, seq_len: int, num_heads: int, device: torch.device, heads: tuple[int, int]):
        blocks = pair_blocks(
            pair,
            seq_len,
            num_heads,
            self.segment_lengths[pair],
            self.dilation_rates[pair],
            len(self.segment_lengths),
            self.semantics,
            *heads,
        )
        index = {b: b.flat_index(num_heads, device).flatten() for b in blocks} if self.gathers_by_index else {}
        return blocks, index

    def plan(
        self, seq_len: int, num_heads: int, device: torch.device, head_range: tuple[int, int] | None = None
    ) -> tuple[list[Block], RowAccess]:
        """Blocks and row access for (N, H); head_range = (first global head, total heads) for a head shard."""
        heads = head_range or (0, num_heads)
        check_head_groups(self.semantics, heads[1], len(self.segment_lengths))
        blocks: list[Block] = []
        index: dict[Block, torch.Tensor] = {}
        for pair, (w, r) in enumerate(zip(self.segment_lengths, self.dilation_rates)):
            key = (
                (pair, len(self.segment_lengths), w, r),
                seq_len,
                num_heads,
                heads,
                self.semantics,
                str(device),
                self.gathers_by_index,
            )
            build = lambda pair=pair: self._plan_pair(pair, seq_len, num_heads, device, heads)  # noqa: E731
            pair_plan, pair_index = self.cached(key, build)
            blocks.extend(pair_plan)
            index.update(pair_index)
        pool = self.memory_pool if self.enable_memory_pool else None
        access = IndexAccess(index) if self.gathers_by_index else ViewAccess(pool)
        return blocks, access

    # forward ----------------------------------------------------------------------------------
    def forward_with_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        head_range: tuple[int, int] | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (B, N, H, D), lse (B, N, H)); lse is −inf where no pair keeps a row. k and v may have fewer
        heads than q (B, N, H_kv, D), H % H_kv == 0: query head h uses kv head h // (H / H_kv).

        head_range = (first, total): q, k, v hold global heads first .. first + H - 1 of `total`
        (head-parallel shards), so offsets and head groups follow the global head index.
        cu_seqlens: packed documents in q, k, v (1, T, H, D), each attended on its own (kernels/documents.py).
        """
        if cu_seqlens is not None:
            call = lambda *x: self.forward_with_lse(*x[:3], is_causal, key_padding_mask=x[3], head_range=head_range)
            return attend_documents(call, q, k, v, key_padding_mask, cu_seqlens)
        check_qkv(q, k, v)
        check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[1], q.device)
        if torch.compiler.is_compiling() and not (self.training and self.dropout > 0):
            from .compiled import compiled_attention  # one opaque custom op, no graph break (kernels/compiled.py)

            k, v = expand_kv(k, v, q.shape[2])  # GQA: traced around the op, autograd sums the groups
            return compiled_attention(self, q, k, v, is_causal, key_padding_mask, head_range)
        attention = self.attention_for(q, is_causal, key_padding_mask is not None, head_range)
        return block_attention(q, k, v, key_padding_mask, attention)

    def attention_for(
        self, q: torch.Tensor, is_causal: bool, masked: bool, head_range: tuple[int, int] | None = None
    ) -> BlockAttention | ChunkedAttention:
        """The engine's work for a call on q's shape: its blocks, or one set per sequence chunk."""
        batch, seq_len, num_heads, head_dim = q.shape
        backend, call, pool = self.prepare_call(q, is_causal, masked)
        length = chunk_length(batch, seq_len, num_heads, head_dim, self.segment_lengths, self.sequence_chunk_elements)
        if length is None:
            blocks, access = self.plan(seq_len, num_heads, q.device, head_range)
            return BlockAttention(blocks, access, backend, call, pool)
        chunks = []
        for i, (start, end) in enumerate(chunk_bounds(seq_len, length)):
            blocks, access = self.plan(end - start, num_heads, q.device, head_range)
            chunks.append(
                (start, end, ChunkedAttention.reseeded(BlockAttention(blocks, access, backend, call, pool), i))
            )
        return ChunkedAttention(chunks)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, **options):
        """q, k, v: (batch, seq_len, heads, head_dim) -> out of the same shape and dtype (k, v: H_kv heads);
        options: forward_with_lse's key_padding_mask and cu_seqlens."""
        return self.forward_with_lse(q, k, v, is_causal, **options)[0]

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        compute_dtype: torch.dtype = torch.float64,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense reference of what this module computes (docs/semantics.md), differentiable; with
        cu_seqlens, one reference per document."""
        if cu_seqlens is not None:
            call = lambda *x: self.reference(*x[:3], is_causal, key_padding_mask=x[3], compute_dtype=compute_dtype)
            return attend_documents(call, q, k, v, key_padding_mask, cu_seqlens)
        return dilated_attention_reference(
            q,
            k,
            v,
            self.segment_lengths,
            self.dilation_rates,
            is_causal,
            self.semantics,
            self.scale,
            key_padding_mask=key_padding_mask,
            compute_dtype=compute_dtype,
        )

    # reporting --------------------------------------------------------------------------------
    def describe(self) -> str:
        rows = "gathered by index" if self.gathers_by_index else "reached through strided views"
        parts = [
            f"{type(self).__name__}: segments {list(self.segment_lengths)}, dilations {list(self.dilation_rates)}, "
            f"semantics {self.semantics}",
            self.describe_backend(),
            f"kept rows {rows}",
            f"pattern cache {'on' if self.use_pattern_cache else 'off'}, "
            f"memory pool {'on' if self.enable_memory_pool else 'off'}",
        ]
        if self.selection_reason:
            parts.insert(0, self.selection_reason)
        return "; ".join(parts)

    def extra_repr(self) -> str:
        return (
            f"segment_lengths={list(self.segment_lengths)}, dilation_rates={list(self.dilation_rates)}, "
            f"semantics={self.semantics!r}, backend={self.backend!r}"
        )


class DilatedAttention(_DilatedAttentionBase):
    """Per pair: gather kept rows by index, attend with an (out, lse) backend, scatter, exact LSE merge."""

    gathers_by_index = True


class ImprovedDilatedAttention(_DilatedAttentionBase):
    """Same function as DilatedAttention; strided views, pattern cache and memory pool."""

    gathers_by_index = False
    default_pattern_cache = True
    default_memory_pool = True
