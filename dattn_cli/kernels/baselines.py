"""The dense baselines a sweep compares against, as modules with the implementations' call signature
`forward(q, k, v, is_causal=False)` on (batch, seq, heads, head_dim) tensors, so that one builder
(workload/build.py) constructs and calls every registered entry the same way.

* SDPAAttention       torch's fused scaled_dot_product_attention (full softmax attention)
* MathAttention       the textbook form: N x N scores, softmax, weighted sum (what SDPA avoids)
* FlashAttention      flash-attn's flash_attn_func (CUDA, half precision; optional extra)
* FA4Attention        FlashAttention-4 (`flash_attn.cute`, PyPI flash-attn-4; CUDA sm90/sm100, half precision)
* CuDNNAttention      scaled_dot_product_attention forced to the cuDNN kernel (CUDA; no fallback to another)
* ReferenceAttention  the dense float64 dilated reference of kernels/reference.py, timed as a baseline
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .flash_kernels import flash_installs
from .heads import expand_kv
from .reference import dilated_attention_reference


class DenseBaseline(nn.Module):
    """Full softmax attention; takes (and ignores) the dilated pattern so it is built like the others."""

    def __init__(
        self,
        segment_lengths: Sequence[int] | None = None,
        dilation_rates: Sequence[int] | None = None,
        semantics: str = "longnet",
        **_: object,
    ):
        super().__init__()

    def describe(self) -> str:
        return f"{type(self).__name__}: dense attention over all (query, key) pairs"


class SDPAAttention(DenseBaseline):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        k, v = expand_kv(k, v, q.shape[2])
        t = lambda x: x.transpose(1, 2)  # noqa: E731  (B, N, H, D) <-> (B, H, N, D)
        return t(F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=is_causal))


class MathAttention(DenseBaseline):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        k, v = expand_kv(k, v, q.shape[2])
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        n = q.shape[1]
        scores = torch.matmul(t(q), t(k).transpose(-1, -2)) * q.shape[-1] ** -0.5
        if is_causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        return t(torch.matmul(torch.softmax(scores, dim=-1), t(v)))


class FlashAttention(DenseBaseline):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        from flash_attn import flash_attn_func

        return flash_attn_func(q, k, v, causal=is_causal)


class FA4Attention(DenseBaseline):
    """FlashAttention-4's flash_attn_func: (B, N, H, D) in, GQA native (H a multiple of H_kv)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        from .flash_kernels import fa4_attention

        return fa4_attention(q, k, v, causal=is_causal)[0]


def fa2_missing() -> str | None:
    """Why the flash baseline cannot run: flash-attn 2 is absent (an install with only flash_attn.cute is FA4)."""
    if flash_installs().fa2:
        return None
    return "needs flash_attn.flash_attn_interface (FlashAttention-2; only FA4's flash_attn.cute is here): " + (
        "pip install 'dattn[flash]'"
    )


@functools.cache
def fa4_import_error() -> str | None:
    """Why flash_attn.cute does not import here (its CUTLASS DSL, CUDA bindings or torch), or None."""
    try:
        import flash_attn.cute.interface  # noqa: F401
    except Exception as exc:  # an ImportError, or a compiled extension refusing this torch/driver
        return f"flash_attn.cute does not import: {type(exc).__name__}: {str(exc)[:200]}"
    return None


class CuDNNAttention(DenseBaseline):
    """torch's sdpa restricted to SDPBackend.CUDNN_ATTENTION: an input cuDNN cannot take raises, rather than
    running another kernel under this name."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        k, v = expand_kv(k, v, q.shape[2])
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return t(F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=is_causal))


class ReferenceAttention(nn.Module):
    """The float64 reference of the configured dilated pattern (the slowest correct answer)."""

    def __init__(
        self, segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str = "longnet", **_: object
    ):
        super().__init__()
        self.segment_lengths, self.dilation_rates, self.semantics = (
            list(segment_lengths),
            list(dilation_rates),
            semantics,
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        return dilated_attention_reference(
            q, k, v, self.segment_lengths, self.dilation_rates, is_causal, self.semantics
        )[0]

    def describe(self) -> str:
        return "ReferenceAttention: dense float64 reference of the dilated pattern"
