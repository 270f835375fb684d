"""Dilated attention implementations, the dense reference, pattern cache and memory pool."""

from .distributed.allgather import DistributedImprovedDilatedAttention
from .block_sparse.patterns import PATTERNS, BlockPattern
from .block_sparse.attention import BlockSparseRingDilatedAttention
from .cache import PatternCache, get_global_pattern_cache, reset_global_pattern_cache
from .dilated import DilatedAttention, ImprovedDilatedAttention
from .distributed.head_parallel import HeadParallelDilatedAttention
from .merge import merge_partial_, merge_partials
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
    RingMultiheadDilatedAttention,
)
from .pool import MemoryPool, get_global_memory_pool, reset_global_memory_pool
from .reference import block_sparse_reference, dilated_attention_reference
from .distributed.ring import RingDilatedAttention
from .registry import (
    REGISTRY,
    Implementation,
    create_dilated_attention,
    create_multihead_dilated_attention,
    get_implementation,
    register,
)

__all__ = [
    "DilatedAttention",
    "ImprovedDilatedAttention",
    "HeadParallelDilatedAttention",
    "RingDilatedAttention",
    "RingMultiheadDilatedAttention",
    "DistributedImprovedDilatedAttention",
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
    "Implementation",
    "register",
    "get_implementation",
    "create_dilated_attention",
    "create_multihead_dilated_attention",
]
