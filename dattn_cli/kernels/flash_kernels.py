"""The flash packages' kernels behind the block-kernel contract (block_kernels.py): FlashAttention-4
(`flash_attn.cute`, PyPI flash-attn-4) and the flash-attn 2 package, and the one detection that tells them
apart (an install with only `flash_attn.cute` is FlashAttention-4, never 2)."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlashInstall:
    """What is importable: FlashAttention-2 (`flash_attn.flash_attn_interface`, the flash-attn package) and
    FlashAttention-4 (`flash_attn.cute`, the flash-attn-4 package). Either can exist without the other."""

    fa2: bool
    fa4: bool


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or one without a spec
        return False


def flash_installs() -> FlashInstall:
    """The one flash detection: an install with only `flash_attn.cute` is FlashAttention-4, not 2."""
    return FlashInstall(fa2=_importable("flash_attn.flash_attn_interface"), fa4=_importable("flash_attn.cute"))


def _accepted(fn, options: dict) -> dict:
    """The options fn's signature names (the flash packages' keyword sets differ across releases)."""
    names = inspect.signature(fn).parameters
    return {name: value for name, value in options.items() if name in names}


def fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None):
    """FlashAttention-4 (`flash_attn.cute.flash_attn_func`) on (B, N, H, D) fp16/bf16 CUDA tensors (k, v may have
    fewer heads: GQA) -> (out (B, N, H, D), lse (B, H, N) fp32, natural log). Differentiable (FA4's own
    autograd). `scale` None: D ** -0.5. Raises ImportError without flash-attn-4. The first call per dtype, head dim
    and causal flag compiles FA4's kernels (seconds to a minute): time it apart."""
    from flash_attn.cute import flash_attn_func

    options = _accepted(flash_attn_func, {"softmax_scale": scale, "causal": causal, "return_lse": True})
    result = flash_attn_func(q, k, v, **options)
    if isinstance(result, torch.Tensor) or result[1] is None:
        raise RuntimeError("this flash-attn-4 returns no logsumexp: install a release with return_lse")
    return result[0], result[1]


class Fa4:
    """FlashAttention-4 through its forward and backward entry points (`flash_attn.cute.interface`:
    `_flash_attn_fwd(q, k, v, softmax_scale=, causal=, return_lse=True)` -> (out, lse, ...) and
    `_flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=, causal=)` -> (dq, dk, dv)); layout (b, m, h, D),
    lse (b, h, m) fp32 natural log, so the backward takes the merged out and lse as every kernel does."""

    name = "fa4"

    def forward(self, q, k, v, key_pad, call):
        from flash_attn.cute.interface import _flash_attn_fwd

        options = _accepted(_flash_attn_fwd, {"softmax_scale": call.scale, "causal": call.causal, "return_lse": True})
        result = _flash_attn_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **options)
        if result[1] is None:
            raise RuntimeError("this flash-attn-4 returns no logsumexp: install a release with return_lse")
        return result[0].transpose(1, 2), result[1]

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        from flash_attn.cute.interface import _flash_attn_bwd

        t = lambda x: x.transpose(1, 2)  # noqa: E731
        options = _accepted(_flash_attn_bwd, {"softmax_scale": call.scale, "causal": call.causal})
        dq, dk, dv = _flash_attn_bwd(t(q), t(k), t(v), t(out), t(dout), lse.float().contiguous(), **options)[:3]
        return t(dq), t(dk), t(dv)


class FlashAttn2:
    """The flash-attn 2 package. Its layout is (b, m, h, D); lse is (b, h, m).

    Forward uses the public `flash_attn_func(..., return_attn_probs=True)`. Backward needs the internal
    `_flash_attn_backward` (to pass the merged out and lse); its keyword set differs across flash-attn 2.x
    releases, so the optional arguments are matched to its signature.
    """

    name = "flash-attn2"
    _OPTIONAL = {
        "window_size": (-1, -1),
        "window_size_left": -1,
        "window_size_right": -1,
        "softcap": 0.0,
        "alibi_slopes": None,
        "deterministic": False,
        "rng_state": None,
    }

    def forward(self, q, k, v, key_pad, call):
        from flash_attn.flash_attn_interface import flash_attn_func

        out, lse, _ = flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=0.0,
            softmax_scale=call.scale,
            causal=call.causal,
            return_attn_probs=True,
        )
        return out.transpose(1, 2), lse

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        from flash_attn.flash_attn_interface import _flash_attn_backward

        t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
        dq, dk, dv = (torch.empty_like(t(x)) for x in (q, k, v))
        optional = _accepted(_flash_attn_backward, self._OPTIONAL)
        _flash_attn_backward(
            t(dout),
            t(q),
            t(k),
            t(v),
            t(out),
            lse.contiguous(),
            dq,
            dk,
            dv,
            dropout_p=0.0,
            softmax_scale=call.scale,
            causal=call.causal,
            **optional,
        )
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
