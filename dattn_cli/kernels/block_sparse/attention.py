"""Block-sparse attention over a block table (patterns.py), single-device or as a ring: the module.

Semantics: each query attends, in one softmax, every key of the key blocks its query block's row of
the table marks (causal: none after it). Rows with no key output 0 with lse -inf.

Two executors for the table patterns, chosen per call (flex.choose_executor) and reported by `describe()`:

* flex   — FlexAttention with a `BlockMask` built from the table (flex.py): CUDA forward and
           backward; CPU forward only.
* gather — each query block's active key blocks as backend calls, merged through the engine's
           autograd boundary (gather.py); on one device local.py runs them.

A token-level pattern (sliding_window) runs on the banded executor instead (window.py; its ring form's halo
exchange in halo.py).

With a process group, the ring form (ring.py): each rank holds a contiguous shard of blocks and
receives exactly the key blocks its queries use; it runs on the gather executor. Any N over any p:
shard_sequence(x, group, block_size=...) pads the sequence and masks the padding; the call's seq_len=N
keeps the block table the real sequence's (blocks of padding only attend nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..dilated import AttentionCore
from ..distributed.comm import CommStats, check_call, group_rank_size
from ..distributed.documents import sharded_documents
from ..distributed.exchange import packed_elements
from ..distributed.layout import check_layout, chunks_per_rank
from ..distributed.shards import TRAFFIC_KEYS
from ..documents import attend_documents, whole_sequence
from ..engine import BlockAttention, ViewAccess, block_attention
from ..heads import expand_kv, kv_group
from ..reference import block_sparse_reference, sliding_window_reference
from ..validation import check_key_padding_mask, check_qkv
from .flex import EXECUTORS, choose_executor, flex_block_mask, flex_forward
from .halo import plan_halo
from .local import LocalBlocks, plan_local
from .patterns import BlockPattern, patterns_taking, takes
from .ring import BlockSparseExchange, RankPlan, plan_rank
from .window import sliding_window_call

# the module ------------------------------------------------------------------------------------------


class BlockSparseRingDilatedAttention(AttentionCore):
    """Block-sparse attention with a named pattern; with a process group, the ring form (each rank passes
    its contiguous shard (B, N/p, H, D)).

    pattern: local | dilated | global_local | hierarchical | longnet | sliding_window (patterns.py); window
    (blocks each side), global_blocks, levels, or density (a target block density that picks the window);
    window_left / window_right: sliding_window's token window (window.py; ring form: halo.py).
    executor: auto | flex | gather (see the module docstring; `describe()` says which ran and why).
    """

    default_pattern_cache = True
    default_memory_pool = False
    signature_fields = (*AttentionCore.signature_fields, "pattern", "executor", "layout")

    def __init__(
        self,
        segment_lengths: Sequence[int] | None = None,
        dilation_rates: Sequence[int] | None = None,
        *,
        pattern: str = "dilated",
        block_size: int = 128,
        window: int | None = None,
        global_blocks: int = 1,
        levels: int = 2,
        density: float | None = None,
        semantics: str = "longnet",
        window_left: int | None = None,
        window_right: int | None = None,
        executor: str = "auto",
        process_group=None,
        layout: str = "contiguous",
        **core_options,  # AttentionCore's: scale, dropout, backend, use_pattern_cache, enable_memory_pool
    ):
        super().__init__(**core_options)
        if takes(pattern, "segments") and (segment_lengths is None or dilation_rates is None):
            raise ValueError(
                f"pattern={pattern!r} needs segment_lengths and dilation_rates, e.g. [2048, 4096] and [1, 2]"
            )
        if semantics != "longnet" and not takes(pattern, "semantics"):
            shaped = " or ".join(repr(name) for name in patterns_taking("semantics"))
            raise ValueError(f"semantics={semantics!r} only applies to pattern={shaped}; leave it at 'longnet'")
        segments = (tuple(segment_lengths or ()), tuple(dilation_rates or ()))
        self.pattern = BlockPattern(
            pattern, block_size, window, global_blocks, levels, density, *segments, semantics, window_left, window_right
        )
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r} is unknown: use one of {', '.join(EXECUTORS)}")
        self.executor = executor
        self.layout = check_layout(layout)
        if layout != "contiguous" and self.pattern.token_level:
            raise ValueError(
                f"pattern={pattern!r} (a token window over halo rows) is not supported with layout={layout!r}: "
                "use layout='contiguous' for the sliding window"
            )
        self.process_group = process_group
        self.stats = CommStats()
        self.last_executor: tuple[str, str] | None = None
        self.last_shape: tuple[int, int] | None = None  # (N, H) of the last call, for density()
        self.last_plan: RankPlan | None = None

    segment_lengths = property(lambda self: self.pattern.segment_lengths)
    dilation_rates = property(lambda self: self.pattern.dilation_rates)
    semantics = property(lambda self: self.pattern.semantics)
    block_size = property(lambda self: self.pattern.block_size)

    # the pattern -------------------------------------------------------------------------------------
    def block_table(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """(num_blocks, num_blocks) bool, True = attend; from the pattern cache."""
        return self.cached(
            ("block_table", self.pattern, seq_len, num_heads), lambda: self.pattern.table(seq_len, num_heads)
        )

    def _shape(self, seq_len: int | None, num_heads: int | None) -> tuple[int, int]:
        if seq_len is None:
            if self.last_shape is None:
                raise ValueError("density() before any forward call: pass seq_len (and num_heads for 'longnet')")
            return self.last_shape
        return seq_len, num_heads if num_heads is not None else (self.last_shape or (0, 1))[1]

    def density(self, seq_len: int | None = None, num_heads: int | None = None) -> float:
        """Active blocks / all blocks of the N x N block grid (default: the last call's shape)."""
        return self.block_table(*self._shape(seq_len, num_heads)).float().mean().item()

    def element_density(
        self, seq_len: int | None = None, num_heads: int | None = None, is_causal: bool = False
    ) -> float:
        """Attended (query, key) pairs / N²: what the work really scales with (ragged and causal exact)."""
        n, h = self._shape(seq_len, num_heads)
        return self.pattern.pairs(n, h, is_causal) / (n * n)

    def attended_pairs(self, seq_len: int, num_heads: int, is_causal: bool = False) -> int:
        """P of the FLOP convention for one batch item: pairs over heads."""
        return num_heads * self.pattern.pairs(seq_len, num_heads, is_causal)

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
        """The dense reference with this module's block table (whole sequence), differentiable; with cu_seqlens
        one reference per document, each with its own length's table."""
        if cu_seqlens is not None:
            call = lambda *x: self.reference(*x[:3], is_causal, key_padding_mask=x[3], compute_dtype=compute_dtype)
            return attend_documents(call, q, k, v, key_padding_mask, cu_seqlens)
        options = dict(key_padding_mask=key_padding_mask, compute_dtype=compute_dtype)
        if self.pattern.token_level:
            return sliding_window_reference(q, k, v, *self.pattern.token_window, is_causal, self.scale, **options)
        table = self.block_table(q.shape[1], q.shape[2])
        return block_sparse_reference(q, k, v, table, self.block_size, is_causal, self.scale, **options)

    # execution -------------------------------------------------------------------------------------
    def forward_with_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        seq_len: int | None = None,
        cu_seqlens: torch.Tensor | None = None,
        need_lse: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of this rank's shard (the whole sequence without a process group). seq_len: the sequence's
        length before shard_sequence padded it (the block table is that length's; the padding must be masked by
        key_padding_mask); default: all positions are real. cu_seqlens: packed documents of the whole sequence,
        each with the block pattern of its own length (kernels/documents.py). lse may be None when not need_lse."""
        if cu_seqlens is not None:
            return self._documents(q, k, v, is_causal, key_padding_mask, seq_len, cu_seqlens)
        return self._forward(q, k, v, is_causal, key_padding_mask, need_lse=need_lse, seq_len=seq_len)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, **options):
        """q, k, v: (batch, seq_len, heads, head_dim) (a shard of N/p in the ring form) -> out, same shape
        (options: forward_with_lse's key_padding_mask, seq_len and cu_seqlens)."""
        return self.forward_with_lse(q, k, v, is_causal, need_lse=False, **options)[0]

    def _documents(self, q, k, v, is_causal, key_padding_mask, seq_len, cu_seqlens):
        if seq_len is not None:
            raise ValueError(
                "seq_len and cu_seqlens together: the documents give the lengths; with padded shards, "
                "end cu_seqlens at the padded length and mask the padding"
            )
        call = lambda *x: self._forward(*x[:3], is_causal, x[3], need_lse=True, local=True)
        _, world = group_rank_size(self.process_group)
        if world == 1:
            return attend_documents(call, q, k, v, key_padding_mask, cu_seqlens)
        if whole_sequence(cu_seqlens, q.shape[1] * world):  # one document: the ring form as it is
            return self._forward(q, k, v, is_causal, key_padding_mask, need_lse=True)
        if self.layout != "contiguous":
            raise ValueError(
                f"{type(self).__name__}: packed documents (cu_seqlens) are not supported with "
                f"layout={self.layout!r}: use layout='contiguous' for packed documents"
            )
        check_call(self, q, k, is_causal, key_padding_mask, "documents")
        return sharded_documents(
            call, q, k, v, key_padding_mask, cu_seqlens, self.process_group, self.stats, type(self).__name__
        )

    def _real_length(self, seq_len: int | None, padded: int, masked: bool) -> int:
        if seq_len is None:
            return padded
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= padded:
            raise ValueError(
                f"seq_len={seq_len!r} is not within the {padded} positions of the shards: pass the "
                "sequence length before padding"
            )
        if seq_len < padded and not masked:
            raise ValueError(
                f"seq_len={seq_len} leaves {padded - seq_len} padded positions unmasked: pass the "
                "key_padding_mask shard_sequence returned"
            )
        return seq_len

    def _padded_table(self, seq_len: int, padded: int, num_heads: int) -> torch.Tensor:
        """The block table of the real sequence, grown to the padded one's blocks: a block of padding only
        attends nothing and is attended by nothing (the ragged last real block keeps its row)."""
        table = self.block_table(seq_len, num_heads)
        blocks = self.pattern.num_blocks(padded)
        if blocks == table.shape[0]:
            return table

        def grow() -> torch.Tensor:
            grown = torch.zeros(blocks, blocks, dtype=torch.bool)
            grown[: table.shape[0], : table.shape[0]] = table
            return grown

        return self.cached(("padded_block_table", self.pattern, seq_len, padded, num_heads), grow)

    def _forward(self, q, k, v, is_causal, key_padding_mask, need_lse, seq_len=None, local=False):
        """local: this rank's tensors as a whole sequence (one packed document), whatever the process group."""
        check_qkv(q, k, v)
        batch, shard, num_heads, _ = q.shape
        check_key_padding_mask(key_padding_mask, batch, shard, q.device)
        rank, world = (0, 1) if local else group_rank_size(self.process_group)
        padded = shard * world
        if self.pattern.token_level:
            self._real_length(seq_len, padded, key_padding_mask is not None)  # padding must be masked
            return sliding_window_call(self, q, k, v, is_causal, key_padding_mask, rank, world)
        group = kv_group(num_heads, k.shape[2])
        # GQA: the engine (or flex below) computes at H heads, the ring sends at the kv heads (ring.py)
        if world > 1 and shard % (self.block_size * chunks_per_rank(world, self.layout)):
            what = "N/p" if self.layout == "contiguous" else f"N/p (two {self.layout} chunks)"
            raise ValueError(
                f"{type(self).__name__}: the shard length {what} = {shard} is not a multiple of "
                f"{'2 x ' if self.layout != 'contiguous' else ''}block_size={self.block_size}: pad with "
                f"shard_sequence(x, group, block_size={self.block_size}, layout={self.layout!r}), or use N "
                "divisible by p * block_size"
            )
        seq_len = self._real_length(seq_len, padded, key_padding_mask is not None)
        self.last_shape = (seq_len, num_heads)
        table = self._padded_table(seq_len, padded, num_heads)
        need_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        dropout = self.training and self.dropout > 0
        masked = key_padding_mask is not None
        executor, reason = choose_executor(self.executor, q, world, need_grad, need_lse, masked, dropout)
        self.last_executor = (executor, reason)
        if executor == "flex":
            self.last_backend = ("flex_attention", "FlexAttention computes the whole pattern in one kernel")
            key = ("flex_block_mask", self.pattern, seq_len, padded, num_heads, bool(is_causal), str(q.device))
            mask = self.cached(key, lambda: flex_block_mask(table, padded, self.block_size, is_causal, q.device))
            scale = q.shape[-1] ** -0.5 if self.scale is None else float(self.scale)
            return flex_forward(q, *expand_kv(k, v, num_heads), mask, scale, need_lse=need_lse)
        if world > 1:
            check_call(self, q, k, is_causal, key_padding_mask, seq_len)
            self.stats.call()
        backend, call, pool = self.prepare_call(q, is_causal, key_padding_mask is not None)
        key = ("block_plan", self.pattern, seq_len, padded, num_heads, bool(is_causal), rank, world, str(q.device))
        if world == 1:  # the single-device executor: every key block is here
            plan = lambda: LocalBlocks(plan_local(table, padded, self.block_size, is_causal, q.device))
            self.last_plan, key_blocks = None, self.cached(key, plan)  # its calls coalesced once per plan
        else:
            key = (*key, self.layout)
            args = (table, padded, self.block_size, rank, world, is_causal, q.device, self.layout)
            plan = self.cached(key, lambda: plan_rank(*args))
            self.last_plan = plan
            key_blocks = BlockSparseExchange(plan, self.block_size, self.process_group, self.stats, group)
        engine = BlockAttention([], ViewAccess(pool), backend, call, pool, key_blocks, rank)
        return block_attention(q, k, v, key_padding_mask, engine)

    # distributed accounting and reporting -----------------------------------------------------------
    def received_blocks(self) -> dict[int, tuple[int, ...]]:
        """Source rank -> the global key blocks this rank received from it on the last (gather) call."""
        return dict(self.last_plan.receive) if self.last_plan else {}

    def comm_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    def comm_volume(
        self,
        seq_len: int,
        num_heads: int,
        head_dim: int,
        batch: int,
        element_size: int,
        is_causal: bool = False,
        masked: bool = False,
        padded_len: int | None = None,
        num_kv_heads: int | None = None,
        rank_world: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """Bytes each rank sends and receives per forward and backward call: exactly the K/V rows (and
        key-mask values) of the blocks other ranks' queries use, and their dK/dV shares back, at the kv heads.
        padded_len: the padded length of the shards (shard_sequence), padding rows included; default seq_len.
        rank_world: (rank, world) to evaluate instead of this process's place in its group (the planner's)."""
        rank, world = rank_world or group_rank_size(self.process_group)
        if world == 1:
            return dict.fromkeys(TRAFFIC_KEYS, 0)
        padded = seq_len if padded_len is None else padded_len
        kv_heads = num_heads // kv_group(num_heads, num_heads if num_kv_heads is None else num_kv_heads)
        if self.pattern.name == "sliding_window":  # the halo rows (halo.py)
            left, right = self.pattern.token_window
            halo = plan_halo(rank, world, padded // world, left, 0 if is_causal else right)
            sent, received = (sum(hi - lo for _, lo, hi in rows) for rows in (halo.send, halo.receive))
        else:
            table = self._padded_table(seq_len, padded, num_heads)
            plan = plan_rank(table, padded, self.block_size, rank, world, is_causal, torch.device("cpu"), self.layout)
            sent = sum(rows.numel() for rows in plan.send.values())
            received = sum(len(b) * self.block_size for b in plan.receive.values())
        size = lambda rows, mask: packed_elements(batch, kv_heads, head_dim, rows, mask) * element_size  # noqa: E731
        return dict(
            zip(TRAFFIC_KEYS, (size(sent, masked), size(received, masked), size(received, False), size(sent, False)))
        )

    def describe(self) -> str:
        _, world = group_rank_size(self.process_group)
        n = self.last_shape[0] if self.last_shape else None
        parts = [f"{type(self).__name__}: pattern {self.pattern.describe(n)}"]
        if self.last_shape:
            parts.append(
                f"density {self.density():.4f} of blocks, {self.element_density():.4f} of (query, key) pairs "
                f"at N={self.last_shape[0]}"
            )
        last = self.last_executor
        ran = f"-> {last[0]} on the last call ({last[1]})" if last else "(flex or gather, chosen per call)"
        parts += [f"executor {self.executor} {ran}", self.describe_backend()]
        if world > 1:
            parts.append(f"ring form over {world} ranks: each rank receives only the key blocks its queries use")
        if self.selection_reason:
            parts.insert(0, self.selection_reason)
        return "; ".join(parts)

    def extra_repr(self) -> str:
        return f"pattern={self.pattern.describe()!r}, executor={self.executor!r}, backend={self.backend!r}"
