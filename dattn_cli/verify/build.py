"""Building the module under test for a case: the same constructor arguments in the single-process
check, on every rank of a distributed one, and for the reference."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import REGISTRY
from .cases import VerifyCase, block_options


def _options(impl: str, case: VerifyCase, semantics: str, backend: str, pattern: str | None) -> dict:
    if REGISTRY[impl].block_sparse:
        return {**block_options(case, pattern or "dilated", semantics), "backend": backend}
    return {"segment_lengths": case.segment_lengths, "dilation_rates": case.dilation_rates, "semantics": semantics,
            "backend": backend}


def build_core(impl: str, case: VerifyCase, semantics: str, backend: str, pattern: str | None = None, **extra) -> nn.Module:
    options = _options(impl, case, semantics, backend, pattern)
    segs, rates = options.pop("segment_lengths", None), options.pop("dilation_rates", None)
    return REGISTRY[impl].cls(segs, rates, **options, **extra)


def build_multihead(
    impl: str, case: VerifyCase, semantics: str, backend: str, seed: int, pattern: str | None = None,
    dtype: torch.dtype = torch.float64, **extra,
) -> nn.Module:
    """Seeded weights (the same on every rank and in the caller), then seeded non-trivial LayerNorm and
    biases so their gradients are checked too."""
    torch.manual_seed(seed)
    module = REGISTRY[impl].cls(case.heads * case.head_dim, case.heads, **_options(impl, case, semantics, backend, pattern),
                                dtype=dtype, **extra)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p))
    return module
