"""Multihead modules with weights worth checking: the same on every rank and in the caller (seeded),
with LayerNorm and biases moved off their zero/one initialisation so their gradients are non-trivial."""

from __future__ import annotations

import torch
from torch import nn

from ..workload.build import build_module
from ..workload.problem import Problem


def seeded_multihead(p: Problem, seed: int, dtype: torch.dtype) -> nn.Module:
    """p's multihead module built under torch.manual_seed(seed), every parameter then nudged by seeded
    noise (0.1 x N(0, 1))."""
    torch.manual_seed(seed)
    module = build_module(p, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=g, dtype=torch.float64).to(param))
    return module
