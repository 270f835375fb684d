"""Attention implementations and baselines, their registry, the dense reference, pattern cache and memory pool.

Layout: single-device kernels here (pattern, engine, backends, merge, dilated, multihead, reference),
sequence/head-parallel forms in kernels/distributed/, block-sparse patterns and executors in
kernels/block_sparse/; every one of them is described by one ImplSpec in registry.py."""

from . import entries  # noqa: F401  (dattn's register() calls: the registry complete on import)
from .block_sparse.attention import BlockSparseRingDilatedAttention as BlockSparseRingDilatedAttention
from .block_sparse.patterns import PATTERNS as PATTERNS, BlockPattern as BlockPattern
from .cache import (
    PatternCache as PatternCache,
    get_global_pattern_cache as get_global_pattern_cache,
    reset_global_pattern_cache as reset_global_pattern_cache,
)
from .dilated import DilatedAttention as DilatedAttention, ImprovedDilatedAttention as ImprovedDilatedAttention
from .distributed.allgather import DistributedImprovedDilatedAttention as DistributedImprovedDilatedAttention
from .distributed.document_layout import DocumentLayout as DocumentLayout, document_layout as document_layout
from .distributed.head_parallel import HeadParallelDilatedAttention as HeadParallelDilatedAttention
from .distributed.hybrid import HybridDilatedAttention as HybridDilatedAttention, hybrid_groups as hybrid_groups
from .distributed.ring import RingDilatedAttention as RingDilatedAttention
from .distributed.sharding import (
    gather_sequence as gather_sequence,
    padded_length as padded_length,
    shard_sequence as shard_sequence,
)
from .merge import merge_partial_ as merge_partial_, merge_partials as merge_partials
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention as BlockSparseRingMultiheadDilatedAttention,
    DistributedImprovedMultiheadDilatedAttention as DistributedImprovedMultiheadDilatedAttention,
    HeadParallelMultiheadDilatedAttention as HeadParallelMultiheadDilatedAttention,
    HybridMultiheadDilatedAttention as HybridMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention as ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention as MultiheadDilatedAttention,
    RingMultiheadDilatedAttention as RingMultiheadDilatedAttention,
)
from .pool import (
    MemoryPool as MemoryPool,
    get_global_memory_pool as get_global_memory_pool,
    reset_global_memory_pool as reset_global_memory_pool,
)
from .reference import (
    block_sparse_reference as block_sparse_reference,
    dilated_attention_reference as dilated_attention_reference,
)
from .registry import (
    REGISTRY as REGISTRY,
    ImplSpec as ImplSpec,
    create_dilated_attention as create_dilated_attention,
    create_multihead_dilated_attention as create_multihead_dilated_attention,
    get_implementation as get_implementation,
    load_plugins,
    register as register,
)

load_plugins()  # implementations registered outside dattn (DATTN_PLUGINS, entry points)
