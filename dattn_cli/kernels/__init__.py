"""Attention implementations and baselines, their registry, the dense reference, pattern cache and memory pool.

Layout: single-device kernels here (pattern, engine, backends, merge, dilated, multihead, reference),
sequence/head-parallel forms in kernels/distributed/, block-sparse patterns and executors in
kernels/block_sparse/; every one of them is described by one ImplSpec in registry.py."""

from . import entries  # noqa: F401  (dattn's register() calls: the registry complete on import)

# the package's public names (the imports below, re-exported):
from .block_sparse.attention import BlockSparseRingDilatedAttention  # noqa: F401
from .block_sparse.patterns import PATTERNS, BlockPattern  # noqa: F401
from .cache import PatternCache, get_global_pattern_cache, reset_global_pattern_cache  # noqa: F401
from .dilated import DilatedAttention, ImprovedDilatedAttention  # noqa: F401
from .distributed.allgather import DistributedImprovedDilatedAttention  # noqa: F401
from .distributed.head_parallel import HeadParallelDilatedAttention  # noqa: F401
from .distributed.ring import RingDilatedAttention  # noqa: F401
from .distributed.sharding import gather_sequence, padded_length, shard_sequence  # noqa: F401
from .merge import merge_partial_, merge_partials  # noqa: F401
from .multihead import (  # noqa: F401
    BlockSparseRingMultiheadDilatedAttention,
    DistributedImprovedMultiheadDilatedAttention,
    HeadParallelMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
    RingMultiheadDilatedAttention,
)
from .pool import MemoryPool, get_global_memory_pool, reset_global_memory_pool  # noqa: F401
from .reference import block_sparse_reference, dilated_attention_reference  # noqa: F401
from .registry import (  # noqa: F401
    REGISTRY,
    ImplSpec,
    create_dilated_attention,
    create_multihead_dilated_attention,
    get_implementation,
    load_plugins,
    register,
)

load_plugins()  # implementations registered outside dattn (DATTN_PLUGINS, entry points)
