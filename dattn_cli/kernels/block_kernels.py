"""The fused kernels a block runs on, each behind the backends' contract (backends.py): forward on (b, h, m, D)
returns (out, lse) with lse the natural-log logsumexp, fp32 (b, h, m); backward takes the *merged* out and lse.

Kernel names are short and stable (bench rows, `dattn env` and `dattn impls` record them):

* cpu-flash   aten's CPU flash op (any float dtype; takes an additive key mask)
* efficient   aten's memory-efficient CUDA op (takes an additive key mask)
* fa2         aten's FlashAttention-2 op (CUDA fp16/bf16, no mask)
* cudnn       aten's cuDNN attention op (CUDA fp16/bf16). Never given a mask: torch 2.11 returns NaN dQ with
              one when seq % 128 == 64 (pytorch#196678). A call that fails runs the fa2 op instead, said once.
* fa4         FlashAttention-4, `flash_attn.cute` (PyPI flash-attn-4), CUDA fp16/bf16, no mask
* flash-attn2 the flash-attn 2 package (`flash_attn.flash_attn_interface`), CUDA fp16/bf16, no mask
* math        backends.MathBackend (plain matmuls)

Which one a block gets is kernel_choice.py's business; `takes_view` is the one rule for strided blocks.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")
aten = torch.ops.aten
log = logging.getLogger(__name__)

KERNEL_NAMES = ("cudnn", "fa2", "fa4", "flash-attn2", "efficient", "cpu-flash", "math")

# aten's FlashAttention-2 op hit an illegal address on tensors of 2**32 elements (N = 8M, H = 8, D = 64 on an
# H200, torch 2.11; 2**31 ran): its offsets overflow int32 there, so larger calls go in batch slices (the
# cuDNN op is sliced alike).
FLASH_OP_MAX_ELEMENTS = 1 << 28


# --- which flash packages are installed (the one detection) ------------------------------------------------
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


# --- helpers ------------------------------------------------------------------------------------------------
def key_bias(key_pad: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(b, m) bool, True = ignore -> additive (b, 1, 1, m) bias."""
    if key_pad is None:
        return None
    bias = torch.zeros(key_pad.shape, dtype=dtype, device=key_pad.device).masked_fill(key_pad, NEG_INF)
    return bias[:, None, None, :]


def batch_sliced(op, tensors: Sequence[torch.Tensor], max_elements: int | None = None) -> tuple:
    """op(*tensors) computed over slices of dim 0 with at most max_elements per tensor, the outputs written into
    tensors laid out like the first slice's (so a (b, h, m, D) view of (b, m, h, D) memory stays one)."""
    b = tensors[0].shape[0]
    max_elements = FLASH_OP_MAX_ELEMENTS if max_elements is None else max_elements
    step = max(1, max_elements // max(1, max(t[0].numel() for t in tensors)))
    if step >= b:
        return tuple(op(*tensors))
    results = None
    for start in range(0, b, step):
        part = op(*(t[start : start + step] for t in tensors))
        if results is None:
            results = [_empty_like_batched(x, b) for x in part]
        for full, piece in zip(results, part):
            full[start : start + step].copy_(piece)
    return tuple(results)


def _empty_like_batched(x: torch.Tensor, b: int) -> torch.Tensor:
    """An empty tensor of batch b with x's dimension order in memory."""
    order = sorted(range(x.dim()), key=lambda i: -x.stride(i)) if x.dim() else []
    if order and order[0] != 0:
        order = [0] + [i for i in order if i != 0]
    shape = (b, *x.shape[1:])
    full = torch.empty([shape[i] for i in order], dtype=x.dtype, device=x.device)
    return full.permute([order.index(i) for i in range(x.dim())])


_USED: dict[str, None] = {}  # kernels run in this process since reset_kernels_used(), in first-use order


def note_used(name: str) -> None:
    if name not in _USED:
        _USED[name] = None


def kernels_used() -> str | None:
    """The kernels blocks ran on since the last reset, joined by '+' ("cudnn", "cudnn+fa2"); None: none."""
    return "+".join(_USED) or None


def reset_kernels_used() -> None:
    _USED.clear()


# --- the strided-block rule ---------------------------------------------------------------------------------
ALIGN_BYTES = 16
# The CPU flash kernel ran ~6% faster on contiguous (b, h, m, D) copies of r > 1 blocks than on their strided
# views (commit 1c2991d), so `auto` keeps copying there; the other kernels take the views.
PREFERS_COPY = frozenset({"cpu-flash"})


def block_layout() -> str:
    """DATTN_BLOCK_LAYOUT: auto (views where the kernel takes them, copies where it needs or prefers them),
    view (views wherever the kernel takes them) or copy (always copy r > 1 blocks: the old behaviour)."""
    value = os.environ.get("DATTN_BLOCK_LAYOUT", "auto").strip().lower() or "auto"
    if value not in ("auto", "view", "copy"):
        raise ValueError(f"DATTN_BLOCK_LAYOUT={value!r} is unknown: use auto, view or copy")
    return value


def takes_view(kernel: str, x: torch.Tensor) -> bool:
    """Whether `kernel` reads the strided block x (any order of its first dims) in place, so no copy is made.

    The rule, for every kernel: the last dimension contiguous (stride 1), every other stride and the data
    pointer 16-byte aligned. The CPU flash op needs the first: with a strided last dimension it returns wrong
    values without an error (tests/kernels/test_block_kernels.py); the CUDA kernels load 16-byte vectors (TMA
    for cuDNN and FA4), hence the second. Beyond the rule, DATTN_BLOCK_LAYOUT (block_layout) decides."""
    layout = block_layout()
    if layout == "copy" or (layout == "auto" and kernel in PREFERS_COPY):
        return False
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        return False
    size = x.element_size()
    if any(s * size % ALIGN_BYTES for s, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1):
        return False
    return x.device.type == "meta" or x.data_ptr() % ALIGN_BYTES == 0


# --- the kernels ------------------------------------------------------------------------------------------------
class CpuFlash:
    name = "cpu-flash"

    def forward(self, q, k, v, key_pad, call):
        bias = key_bias(key_pad, q.dtype)
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, call.causal, attn_mask=bias, scale=call.scale
        )

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        bias = key_bias(key_pad, q.dtype)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, call.causal, attn_mask=bias, scale=call.scale
        )


class Efficient:
    """aten's memory-efficient CUDA kernel: the fused CUDA kernel that takes an additive mask."""

    name = "efficient"

    def forward(self, q, k, v, key_pad, call):
        bias = key_bias(key_pad, q.dtype)
        if bias is not None:
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.0, call.causal, scale=call.scale
        )
        return out, lse[..., : q.shape[2]]

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        bias = key_bias(key_pad, q.dtype)
        # The memory-efficient backward reads `out` as if laid out (b, m, h, D) contiguously (its delta pass
        # takes the row stride as h * D), so the gathered, strided rows are copied into that layout.
        out, dout = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (out, dout))
        m = q.shape[2]
        padded = torch.nn.functional.pad(lse, (0, -(-m // 32) * 32 - m))
        if bias is not None:
            bias = bias.expand(q.shape[0], q.shape[1], m, k.shape[2])
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, k, v, bias, out, padded, zero, zero, 0.0, [True, True, True, False], call.causal, scale=call.scale
        )
        return dq, dk, dv


class Fa2Op:
    """aten's FlashAttention-2 op (no mask), in batch slices past FLASH_OP_MAX_ELEMENTS."""

    name = "fa2"

    def forward(self, q, k, v, key_pad, call):
        def op(q, k, v):
            return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, call.causal, False, scale=call.scale)[:2]

        return batch_sliced(op, (q, k, v))

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        unused = torch.empty(0, dtype=torch.int64, device=q.device)  # philox state: read only with dropout

        def op(dout, q, k, v, out, lse):
            return aten._scaled_dot_product_flash_attention_backward(
                dout,
                q,
                k,
                v,
                out,
                lse,
                None,
                None,
                q.shape[2],
                k.shape[2],
                0.0,
                call.causal,
                unused,
                unused,
                scale=call.scale,
            )

        return batch_sliced(op, (dout, q, k, v, out, lse.contiguous()))


_said_fallback = False
_CUDNN_FAILED: set[tuple] = set()  # call signatures cuDNN refused: they go straight to the fa2 op


def _say_fallback(exc: BaseException) -> None:
    global _said_fallback
    if not _said_fallback:
        _said_fallback = True
        message = f"dattn: a cuDNN attention call failed ({type(exc).__name__}: {exc}); running aten's FA2 op instead"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class Cudnn:
    """aten's cuDNN attention op, without a mask (pytorch#196678). Its forward's logsumexp is (b, h, m, 1) fp32
    in torch 2.13; the backward gets the merged lse as a contiguous (b, h, m) fp32 tensor with the rank the
    forward returns (a trailing 1), which is the same memory. A failing call (an unsupported shape, a graph that
    does not build) runs the fa2 op instead, remembered per call signature and said once per process."""

    name = "cudnn"

    def forward(self, q, k, v, key_pad, call):
        def op(q, k, v):
            out, lse = aten._scaled_dot_product_cudnn_attention(
                q, k, v, None, True, 0.0, call.causal, False, scale=call.scale
            )[:2]
            return out, lse.reshape(lse.shape[:3])

        return self._or_fa2("forward", op, (q, k, v), lambda: KERNELS["fa2"].forward(q, k, v, None, call), call)

    def backward(self, dout, q, k, v, out, lse, key_pad, call):
        seed = torch.zeros((), dtype=torch.int64, device=q.device)  # philox state: read only with dropout
        lse = lse.float().contiguous()

        def op(dout, q, k, v, out, lse):
            return aten._scaled_dot_product_cudnn_attention_backward(
                dout,
                q,
                k,
                v,
                out,
                lse.unsqueeze(-1),
                seed,
                seed,
                None,
                None,
                None,
                q.shape[2],
                k.shape[2],
                0.0,
                call.causal,
                scale=call.scale,
            )

        def fa2():
            return KERNELS["fa2"].backward(dout, q, k, v, out, lse, None, call)

        return self._or_fa2("backward", op, (dout, q, k, v, out, lse), fa2, call)

    def _or_fa2(self, direction, op, tensors, fa2, call):
        signature = (direction, tuple(tensors[0].shape), tuple(tensors[-1].shape), tensors[1].dtype, call.causal)
        if signature not in _CUDNN_FAILED:
            try:
                return batch_sliced(op, tensors)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as exc:
                _CUDNN_FAILED.add(signature)
                _say_fallback(exc)
        note_used("fa2")
        return fa2()


def _accepted(fn, options: dict) -> dict:
    """The options fn's signature names (the flash packages' keyword sets differ across releases)."""
    names = inspect.signature(fn).parameters
    return {name: value for name, value in options.items() if name in names}


def fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None):
    """FlashAttention-4 (`flash_attn.cute.flash_attn_func`) on (B, N, H, D) fp16/bf16 CUDA tensors (k, v may have
    fewer heads: GQA) -> (out (B, N, H, D), lse (B, H, N) fp32, natural log). Differentiable (FA4's own
    autograd). `scale` None: D ** -0.5. Raises ImportError without flash-attn-4. The first call of a shape
    compiles FA4's kernels (seconds): time it apart."""
    from flash_attn.cute import flash_attn_func

    options = _accepted(flash_attn_func, {"softmax_scale": scale, "causal": causal, "return_lse": True})
    result = flash_attn_func(q, k, v, **options)
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


KERNELS = {k.name: k for k in (CpuFlash(), Efficient(), Fa2Op(), Cudnn(), Fa4(), FlashAttn2())}


def half_without_mask(q: torch.Tensor, masked: bool) -> bool:
    """Where the fast CUDA kernels (fa2, cudnn, fa4, flash-attn2) apply: CUDA, fp16/bf16, no key mask, head dim
    a multiple of 8 up to 256."""
    d = q.shape[-1]
    return q.is_cuda and not masked and q.dtype in (torch.float16, torch.bfloat16) and d % 8 == 0 and d <= 256
