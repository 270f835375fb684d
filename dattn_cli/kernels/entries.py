"""dattn's own registry entries: every implementation, baseline and peer, one ImplSpec each (dattn's classes from
one table of (core, multihead wrapper) pairs; baselines and peers through `_entry` with their kind's defaults).

The package imports this module with the registry (kernels/__init__.py), so REGISTRY is complete wherever it
is read; plugins register theirs the same way (registry.load_plugins).
"""

from __future__ import annotations

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
from .distributed.hybrid import HybridDilatedAttention
from .distributed.ring import RingDilatedAttention
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention,
    DistributedImprovedMultiheadDilatedAttention,
    HeadParallelMultiheadDilatedAttention,
    HybridMultiheadDilatedAttention,
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
    hybrid_shards,
    register,
    segment_aligned_shards,
)

_SEQUENCE_PARALLEL = dict(distributed=True, single_device=False, shard_rule=segment_aligned_shards)
_HEAD_PARALLEL = dict(distributed=True, single_device=False, shard_rule=head_shards)
_BLOCK_SPARSE = dict(
    strategy="block_sparse",
    pairs=block_sparse_pairs,
    memory_model=None,
    distributed=True,
    block_sparse=True,
    shard_rule=block_aligned_shards,
)
_BASELINE = dict(kind="core", baseline=True, backends=())
_DENSE = dict(_BASELINE, strategy="dense", pairs=dense_pairs, memory_model="dense")
# peers are measured beside dattn's classes, not chosen by `auto` nor checked by verify (a baseline's place)
_PEER = dict(kind="core", strategy="peer", baseline=True, backends=(), memory_model=None)

# dattn's classes, each with its multihead wrapper (the same entry with projections around the core)
_OWN = (
    (
        DilatedAttention,
        MultiheadDilatedAttention,
        "gather by index, backend per block, exact LSE merge",
        dict(strategy="single", memory_model="index_gather"),
    ),
    (
        ImprovedDilatedAttention,
        ImprovedMultiheadDilatedAttention,
        "strided views, pattern cache, memory pool",
        dict(strategy="single", preferred=True),
    ),
    (
        RingDilatedAttention,
        RingMultiheadDilatedAttention,
        "contiguous shards; sparsified K/V rotated around each segment's ranks",
        dict(strategy="ring", preferred=True, **_SEQUENCE_PARALLEL),
    ),
    (
        DistributedImprovedDilatedAttention,
        DistributedImprovedMultiheadDilatedAttention,
        "contiguous shards; sparsified K/V all-gathered within each segment's ranks (LongNet)",
        dict(strategy="allgather", **_SEQUENCE_PARALLEL),
    ),
    (
        HeadParallelDilatedAttention,
        HeadParallelMultiheadDilatedAttention,
        "all-to-all sequence shards -> head shards, dilated attention on H/p heads, all-to-all back",
        dict(strategy="head_parallel", **_HEAD_PARALLEL),
    ),
    (
        HybridDilatedAttention,
        HybridMultiheadDilatedAttention,
        "h x ring: all-to-all seq -> heads inside blocks of h ranks, sparsified K/V rotated around the blocks",
        dict(strategy="hybrid", memory_model=None, distributed=True, single_device=False, shard_rule=hybrid_shards),
    ),
    (
        BlockSparseRingDilatedAttention,
        BlockSparseRingMultiheadDilatedAttention,
        "block patterns (local, dilated, global_local, hierarchical, longnet) on FlexAttention or gathered key "
        "blocks; ring form sends only used key blocks",
        _BLOCK_SPARSE,
    ),
)
for core, wrapper, summary, options in _OWN:
    register(ImplSpec(core.__name__, core, "core", summary=summary, **options))
    register(ImplSpec(wrapper.__name__, wrapper, "multihead", summary=f"projections around {core.__name__}", **options))


def _entry(defaults: dict, name: str, cls, summary: str, **options) -> None:
    """A baseline or peer: its kind's defaults (_DENSE, _PEER), then its own options."""
    register(ImplSpec(name, cls, summary=summary, **{**defaults, **options}))


_entry(_DENSE, "sdpa", SDPAAttention, "torch scaled_dot_product_attention, all pairs")
_entry(_DENSE, "math", MathAttention, "N x N scores, softmax, weighted sum", memory_model="dense_scores")
_entry(
    _DENSE,
    "flash",
    FlashAttention,
    "flash-attn flash_attn_func, all pairs",
    devices=("cuda",),
    requires=("flash_attn",),
    probe=fa2_missing,
    install_hint="pip install 'dattn[flash]'",
)
_entry(
    _DENSE,
    "reference",
    ReferenceAttention,
    "the dense float64 reference of the dilated pattern",
    strategy="reference",
    memory_model="reference",
)
_entry(
    _DENSE,
    "flash4",
    FA4Attention,
    "FlashAttention-4 (flash_attn.cute) flash_attn_func, all pairs",
    devices=("cuda",),
    install_hint="pip install flash-attn-4 (CUDA 12.9+ or 13, sm90/sm100)",
    probe=fa4_import_error,
)
_entry(
    _DENSE,
    "cudnn",
    CuDNNAttention,
    "torch scaled_dot_product_attention forced to the cuDNN kernel, all pairs",
    devices=("cuda",),
    probe=lambda: None if torch.backends.cudnn.is_available() else f"torch {torch.__version__} has no cuDNN",
)
_entry(
    _PEER,
    "flex_dilated",
    FlexDilatedAttention,
    "FlexAttention, the dilated pattern as score_mod + log c(t,u): dattn's function",
)
_entry(
    _PEER,
    "flex_dilated_mask",
    FlexDilatedMaskAttention,
    "FlexAttention, the pattern as a boolean mask (c > 0): ANOTHER function, keys counted once",
)
_FKODOM_HINT = (
    "pip install --no-deps dilated-attention-pytorch==0.2.0 einops and an xformers built for this torch "
    "(0.2.0 pins xformers<0.0.22 and torchscale~=0.2.0, made for torch 2.0); --semantics head_groups"
)
_entry(
    _PEER,
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
_entry(
    _PEER,
    "seed",
    SeedDilatedAttention,
    "the seed project's DilatedAttention (DarcStar-Solutions-Tech), head_groups pattern; ANOTHER "
    "function: the output divided by the number of pairs",
    requires=("dilated_attention_pytorch",),
    install_hint=_SEED_HINT,
    probe=lambda: import_problem(SEED),
)
