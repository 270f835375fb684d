"""Models built from the attention implementations: the LongNet transformer block and language model."""

from .longnet import DilatedTransformerBlock, LongNetLM

__all__ = ["DilatedTransformerBlock", "LongNetLM"]
