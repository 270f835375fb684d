"""Block-sparse attention: patterns as block tables (patterns.py) and the module that runs them
(attention.py), with its FlexAttention (flex.py) and gather (gather.py) executors and its ring form
(ring.py)."""

from .attention import BlockSparseRingDilatedAttention
from .patterns import PATTERNS, BlockPattern

__all__ = ["BlockSparseRingDilatedAttention", "BlockPattern", "PATTERNS"]
