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
* math        MathBackend: plain matmuls, any device, any dtype, dropout; chunked over b to bound scores

fa4 and flash-attn2 live in flash_kernels.py. Which kernel a block gets is kernel_choice.py's business;
`takes_view` is the one rule for strided blocks.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .flash_kernels import Fa4, FlashAttn2

NEG_INF = float("-inf")
MATH_SCORE_BUDGET_BYTES = 1 << 28
aten = torch.ops.aten
log = logging.getLogger(__name__)

KERNEL_NAMES = ("cudnn", "fa2", "fa4", "flash-attn2", "efficient", "cpu-flash", "math")

# aten's FlashAttention-2 op hit an illegal address on tensors of 2**32 elements (N = 8M, H = 8, D = 64 on an
# H200, torch 2.11; 2**31 ran): its offsets overflow int32 there, so larger calls go in batch slices (the
# cuDNN op is sliced alike).
FLASH_OP_MAX_ELEMENTS = 1 << 28


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
@dataclass(frozen=True)
class BlockCall:
    """What one backend call needs besides the tensors."""

    causal: bool
    scale: float
    dropout_p: float = 0.0
    seed: int = 0


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where sums, scores and lse are kept: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class MathBackend:
    name = "math"

    def takes_view(self, x: torch.Tensor, masked: bool) -> bool:
        return takes_view("math", x)

    def _chunks(self, q: torch.Tensor):
        b, h, m, _ = q.shape
        per_item = max(1, h * m * m * 4 * 3)
        step = max(1, MATH_SCORE_BUDGET_BYTES // per_item)
        return [slice(i, min(b, i + step)) for i in range(0, b, step)]

    def _scores(self, q, k, key_pad, call: BlockCall, rows: slice) -> torch.Tensor:
        acc = accumulator_dtype(q.dtype)
        s = torch.matmul(q[rows].to(acc), k[rows].to(acc).transpose(-1, -2)).mul_(call.scale)
        bias = key_bias(None if key_pad is None else key_pad[rows], acc)
        if bias is not None:
            s.add_(bias)
        if call.causal:
            m = q.shape[2]
            s.masked_fill_(torch.ones(m, m, dtype=torch.bool, device=q.device).triu_(1), NEG_INF)
        return s

    @staticmethod
    def _generator(call: BlockCall, device) -> torch.Generator | None:
        """The call's dropout stream (engine.dropout_stream): drawn chunk after chunk, in the same order in
        forward and backward, so backward sees forward's masks."""
        return torch.Generator(device=device).manual_seed(call.seed) if call.dropout_p > 0 else None

    def _dropout_scale(self, shape, call: BlockCall, gen: torch.Generator) -> torch.Tensor:
        keep = torch.rand(shape, generator=gen, device=gen.device) >= call.dropout_p
        return keep.float() / (1.0 - call.dropout_p)

    def forward(self, q, k, v, key_pad, call: BlockCall):
        note_used(self.name)  # the math backend is called directly, not through a dispatcher
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=accumulator_dtype(q.dtype), device=q.device)
        gen = self._generator(call, q.device)
        for rows in self._chunks(q):
            s = self._scores(q, k, key_pad, call, rows)
            block_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            p = torch.exp(s - block_lse.masked_fill(block_lse == NEG_INF, 0.0))
            if call.dropout_p > 0:
                p.mul_(self._dropout_scale(p.shape, call, gen))
            out[rows] = torch.matmul(p, v[rows].to(p.dtype)).to(q.dtype)
            lse[rows] = block_lse.squeeze(-1)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        gen = self._generator(call, q.device)
        for rows in self._chunks(q):
            s = self._scores(q, k, key_pad, call, rows)
            row_lse = lse[rows].unsqueeze(-1).to(s.dtype)
            p = torch.exp(s - row_lse.masked_fill(row_lse == NEG_INF, float("inf")))
            do, o = dout[rows].to(s.dtype), out[rows].to(s.dtype)
            dp = torch.matmul(do, v[rows].to(s.dtype).transpose(-1, -2))
            if call.dropout_p > 0:
                keep = self._dropout_scale(p.shape, call, gen)
                dv[rows] = torch.matmul((p * keep).transpose(-1, -2), do).to(v.dtype)
                dp.mul_(keep)
            else:
                dv[rows] = torch.matmul(p.transpose(-1, -2), do).to(v.dtype)
            delta = (do * o).sum(-1, keepdim=True)
            ds = p.mul_(dp.sub_(delta)).mul_(call.scale)
            dq[rows] = torch.matmul(ds, k[rows].to(s.dtype)).to(q.dtype)
            dk[rows] = torch.matmul(ds.transpose(-1, -2), q[rows].to(s.dtype)).to(k.dtype)
        return dq, dk, dv


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

        m, n = q.shape[2], k.shape[2]  # batch slices split dim 0 only

        def op(*tensors):  # dout, q, k, v, out, lse of one batch slice
            return aten._scaled_dot_product_flash_attention_backward(
                *tensors, None, None, m, n, 0.0, call.causal, unused, unused, scale=call.scale
            )

        return batch_sliced(op, (dout, q, k, v, out, lse.contiguous()))


@functools.cache
def _zero(device: torch.device) -> torch.Tensor:
    """One int64 zero per device (not a fill kernel per backward call)."""
    return torch.zeros((), dtype=torch.int64, device=device)


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
        seed = _zero(q.device)  # philox state: read only with dropout
        lse = lse.float().contiguous()
        m, n = q.shape[2], k.shape[2]  # batch slices split dim 0 only

        def op(*inputs):  # dout, q, k, v, out, lse (b, h, m, 1) of one batch slice
            return aten._scaled_dot_product_cudnn_attention_backward(
                *inputs, seed, seed, None, None, None, m, n, 0.0, call.causal, scale=call.scale
            )

        fa2 = lambda: KERNELS["fa2"].backward(dout, q, k, v, out, lse, None, call)
        return self._or_fa2("backward", op, (dout, q, k, v, out, lse.unsqueeze(-1)), fa2, call)

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


KERNELS = {k.name: k for k in (MathBackend(), CpuFlash(), Efficient(), Fa2Op(), Cudnn(), Fa4(), FlashAttn2())}


def half_without_mask(q: torch.Tensor, masked: bool) -> bool:
    """Where the fast CUDA kernels (fa2, cudnn, fa4, flash-attn2) apply: CUDA, fp16/bf16, no key mask, head dim
    a multiple of 8 up to 256."""
    d = q.shape[-1]
    return q.is_cuda and not masked and q.dtype in (torch.float16, torch.bfloat16) and d % 8 == 0 and d <= 256
