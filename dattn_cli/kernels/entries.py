"""dattn's own registry entries: every implementation, baseline and peer, one `register(ImplSpec(...))` each.

The package imports this module with the registry (kernels/__init__.py), so REGISTRY is complete wherever it
is read; plugins register theirs the same way (registry.load_plugins).
"""

from __future__ import annotations

from typing import Any

import torch

from .baselines import (
    CuDNNAttention,
    FA4Attention,
    FlashAttention,
    MathAttention,
    ReferenceAttention,
    SDPAAttention,
    fa2_missing,
    fa4_import_error,
)
from .block_sparse.attention import BlockSparseRingDilatedAttention
from .dilated import DilatedAttention, ImprovedDilatedAttention
from .distributed.allgather import DistributedImprovedDilatedAttention
from .distributed.head_parallel import HeadParallelDilatedAttention
from .distributed.ring import RingDilatedAttention
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention,
    DistributedImprovedMultiheadDilatedAttention,
    HeadParallelMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
    RingMultiheadDilatedAttention,
)
from .peers import (
    FKODOM,
    SEED,
    FkodomDilatedAttention,
    FlexDilatedAttention,
    FlexDilatedMaskAttention,
    SeedDilatedAttention,
    import_problem,
)
from .registry import (
    ImplSpec,
    block_aligned_shards,
    block_sparse_pairs,
    dense_pairs,
    head_shards,
    register,
    segment_aligned_shards,
)

_SEQUENCE_PARALLEL = dict(distributed=True, single_device=False, shard_rule=segment_aligned_shards)
_HEAD_PARALLEL = dict(distributed=True, single_device=False, shard_rule=head_shards)
_BLOCK_SPARSE = dict(
    pairs=block_sparse_pairs, memory_model=None, distributed=True, block_sparse=True, shard_rule=block_aligned_shards
)
_CUDA = ("cuda",)


def _own(cls: type, kind: str, strategy: str, summary: str, **options: Any) -> None:
    register(ImplSpec(cls.__name__, cls, kind, strategy, summary, **options))


def _baseline(name: str, cls: type, summary: str, memory_model: str | None = "dense", **options: Any) -> None:
    """A dense reference point (strategy "dense" unless given): not chosen by `auto` nor checked by verify."""
    options = dict(strategy="dense", pairs=dense_pairs) | options
    register(
        ImplSpec(name, cls, "core", summary=summary, memory_model=memory_model, baseline=True, backends=(), **options)
    )


def _peer(name: str, cls: type, summary: str, **options: Any) -> None:
    # peers are measured beside dattn's classes, not chosen by `auto` nor checked by verify (a baseline's place)
    _baseline(name, cls, summary, None, strategy="peer", pairs=ImplSpec.pairs, **options)


_own(
    DilatedAttention,
    "core",
    "single",
    "gather by index, backend per block, exact LSE merge",
    memory_model="index_gather",
)
_own(ImprovedDilatedAttention, "core", "single", "strided views, pattern cache, memory pool", preferred=True)
_own(
    MultiheadDilatedAttention, "multihead", "single", "projections around DilatedAttention", memory_model="index_gather"
)
_own(
    ImprovedMultiheadDilatedAttention,
    "multihead",
    "single",
    "projections around ImprovedDilatedAttention",
    preferred=True,
)
_own(
    RingDilatedAttention,
    "core",
    "ring",
    "contiguous shards; sparsified K/V rotated around each segment's ranks",
    preferred=True,
    **_SEQUENCE_PARALLEL,
)
_own(
    RingMultiheadDilatedAttention,
    "multihead",
    "ring",
    "projections around RingDilatedAttention",
    preferred=True,
    **_SEQUENCE_PARALLEL,
)
_own(
    DistributedImprovedDilatedAttention,
    "core",
    "allgather",
    "contiguous shards; sparsified K/V all-gathered within each segment's ranks (LongNet)",
    **_SEQUENCE_PARALLEL,
)
_own(
    DistributedImprovedMultiheadDilatedAttention,
    "multihead",
    "allgather",
    "projections around DistributedImprovedDilatedAttention",
    **_SEQUENCE_PARALLEL,
)
_own(
    HeadParallelDilatedAttention,
    "core",
    "head_parallel",
    "all-to-all sequence shards -> head shards, dilated attention on H/p heads, all-to-all back",
    **_HEAD_PARALLEL,
)
_own(
    HeadParallelMultiheadDilatedAttention,
    "multihead",
    "head_parallel",
    "projections around HeadParallelDilatedAttention",
    **_HEAD_PARALLEL,
)
_own(
    BlockSparseRingDilatedAttention,
    "core",
    "block_sparse",
    "block patterns (local, dilated, global_local, hierarchical, longnet) on FlexAttention or "
    "gathered key blocks; ring form sends only used key blocks",
    **_BLOCK_SPARSE,
)
_own(
    BlockSparseRingMultiheadDilatedAttention,
    "multihead",
    "block_sparse",
    "projections around BlockSparseRingDilatedAttention",
    **_BLOCK_SPARSE,
)
_baseline("sdpa", SDPAAttention, "torch scaled_dot_product_attention, all pairs")
_baseline("math", MathAttention, "N x N scores, softmax, weighted sum", "dense_scores")
_baseline(
    "flash",
    FlashAttention,
    "flash-attn flash_attn_func, all pairs",
    devices=_CUDA,
    requires=("flash_attn",),
    probe=fa2_missing,
    install_hint="pip install 'dattn[flash]'",
)
_baseline(
    "reference",
    ReferenceAttention,
    "the dense float64 reference of the dilated pattern",
    "reference",
    strategy="reference",
)
_baseline(
    "flash4",
    FA4Attention,
    "FlashAttention-4 (flash_attn.cute) flash_attn_func, all pairs",
    devices=_CUDA,
    install_hint="pip install flash-attn-4 (CUDA 12.9+ or 13, sm90/sm100)",
    probe=fa4_import_error,
)
_baseline(
    "cudnn",
    CuDNNAttention,
    "torch scaled_dot_product_attention forced to the cuDNN kernel, all pairs",
    devices=_CUDA,
    probe=lambda: None if torch.backends.cudnn.is_available() else f"torch {torch.__version__} has no cuDNN",
)
_peer(
    "flex_dilated",
    FlexDilatedAttention,
    "FlexAttention, the dilated pattern as score_mod + log c(t,u): dattn's function",
)
_peer(
    "flex_dilated_mask",
    FlexDilatedMaskAttention,
    "FlexAttention, the pattern as a boolean mask (c > 0): ANOTHER function, keys counted once",
)
_FKODOM_HINT = (
    "pip install --no-deps dilated-attention-pytorch==0.2.0 einops and an xformers built for this torch "
    "(0.2.0 pins xformers<0.0.22 and torchscale~=0.2.0, made for torch 2.0); --semantics head_groups"
)
_peer(
    "fkodom",
    FkodomDilatedAttention,
    "fkodom's dilated-attention-pytorch 0.2.0 (xformers), head_groups pattern; ANOTHER function: "
    "each pair's output divided by its sum over the positions, then by the number of pairs",
    requires=("dilated_attention_pytorch", "xformers", "einops"),
    install_hint=_FKODOM_HINT,
    probe=lambda: import_problem(FKODOM),
)
_SEED_HINT = (
    "not on PyPI (the name dilated-attention-pytorch there is fkodom's): pip install "
    "git+https://github.com/DarcStar-Solutions-Tech/dilated-attention-pytorch (needs torchscale; it replaces "
    "fkodom's package, both import as dilated_attention_pytorch); --semantics head_groups"
)
_peer(
    "seed",
    SeedDilatedAttention,
    "the seed project's DilatedAttention (DarcStar-Solutions-Tech), head_groups pattern; ANOTHER "
    "function: the output divided by the number of pairs",
    requires=("dilated_attention_pytorch",),
    install_hint=_SEED_HINT,
    probe=lambda: import_problem(SEED),
)
