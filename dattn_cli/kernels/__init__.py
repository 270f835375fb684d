"""Attention implementations and baselines, their registry, the dense reference, pattern cache and memory pool.

Layout: single-device kernels here (pattern, engine, backends, merge, dilated, multihead, reference),
sequence/head-parallel forms in kernels/distributed/, block-sparse patterns and executors in
kernels/block_sparse/; every one of them is described by one ImplSpec in registry.py."""

from . import entries  # noqa: F401  (dattn's register() calls: the registry complete on import)
from .block_sparse.attention import BlockSparseRingDilatedAttention
from .block_sparse.patterns import PATTERNS, BlockPattern
from .cache import PatternCache, get_global_pattern_cache, reset_global_pattern_cache
from .dilated import DilatedAttention, ImprovedDilatedAttention
from .distributed.allgather import DistributedImprovedDilatedAttention
from .distributed.head_parallel import HeadParallelDilatedAttention
from .distributed.ring import RingDilatedAttention
from .distributed.sharding import gather_sequence, padded_length, shard_sequence
from .merge import merge_partial_, merge_partials
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention,
    DistributedImprovedMultiheadDilatedAttention,
    HeadParallelMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
    RingMultiheadDilatedAttention,
)
from .pool import MemoryPool, get_global_memory_pool, reset_global_memory_pool
from .reference import block_sparse_reference, dilated_attention_reference
from .registry import (
    REGISTRY,
    ImplSpec,
    create_dilated_attention,
    create_multihead_dilated_attention,
    get_implementation,
    load_plugins,
    register,
)

__all__ = [
    "DilatedAttention",
    "ImprovedDilatedAttention",
    "HeadParallelDilatedAttention",
    "RingDilatedAttention",
    "RingMultiheadDilatedAttention",
    "DistributedImprovedDilatedAttention",
    "DistributedImprovedMultiheadDilatedAttention",
    "HeadParallelMultiheadDilatedAttention",
    "BlockSparseRingDilatedAttention",
    "BlockSparseRingMultiheadDilatedAttention",
    "BlockPattern",
    "PATTERNS",
    "block_sparse_reference",
    "MultiheadDilatedAttention",
    "ImprovedMultiheadDilatedAttention",
    "dilated_attention_reference",
    "merge_partial_",
    "merge_partials",
    "PatternCache",
    "get_global_pattern_cache",
    "reset_global_pattern_cache",
    "MemoryPool",
    "get_global_memory_pool",
    "reset_global_memory_pool",
    "REGISTRY",
    "ImplSpec",
    "register",
    "get_implementation",
    "create_dilated_attention",
    "create_multihead_dilated_attention",
    "shard_sequence",
    "gather_sequence",
    "padded_length",
]

load_plugins()  # implementations registered outside dattn (DATTN_PLUGINS, entry points)
