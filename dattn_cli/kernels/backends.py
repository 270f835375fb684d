"""Attention backends for one block: dense attention on (b, h, m, D) that returns (out, lse).

Each backend offers `forward` and `backward`. The backward takes the *merged* out and lse of the rows
(not the block's own), which makes the per-block gradients sum to the exact gradient of the merged
result (the technique ring attention uses); see engine.py.

* math  — plain PyTorch matmuls, any device, any dtype, dropout; chunked over b to bound scores.
* sdpa  — PyTorch's fused kernels through the aten ops that return the logsumexp.
* flash — the flash-attn package (CUDA, fp16/bf16), when installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")
MATH_SCORE_BUDGET_BYTES = 1 << 28


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


def _key_bias(key_pad: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(b, m) bool, True = ignore → additive (b, 1, 1, m) bias."""
    if key_pad is None:
        return None
    bias = torch.zeros(key_pad.shape, dtype=dtype, device=key_pad.device).masked_fill(key_pad, NEG_INF)
    return bias[:, None, None, :]


def _rows_without_keys(key_pad: torch.Tensor, causal: bool) -> torch.Tensor:
    """(b, 1, m) or (b, 1, 1) bool: query rows that no unmasked key is offered to (causal blocks are
    square: none at or before the row; otherwise: every key of the block masked)."""
    if causal:
        dead = (~key_pad).cumsum(dim=-1) == 0
    else:
        dead = key_pad.all(dim=-1, keepdim=True)
    return dead.unsqueeze(1)


class MathBackend:
    name = "math"

    def _chunks(self, q: torch.Tensor):
        b, h, m, _ = q.shape
        per_item = max(1, h * m * m * 4 * 3)
        step = max(1, MATH_SCORE_BUDGET_BYTES // per_item)
        return [slice(i, min(b, i + step)) for i in range(0, b, step)]

    def _scores(self, q, k, key_pad, call: BlockCall, rows: slice) -> torch.Tensor:
        acc = accumulator_dtype(q.dtype)
        s = torch.matmul(q[rows].to(acc), k[rows].to(acc).transpose(-1, -2)).mul_(call.scale)
        bias = _key_bias(None if key_pad is None else key_pad[rows], acc)
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


# aten's FlashAttention-2 op hit an illegal address on tensors of 2**32 elements (N = 8M, H = 8, D = 64 on an
# H200, torch 2.11; 2**31 ran): its offsets overflow int32 there, so larger calls go in batch slices.
FLASH_OP_MAX_ELEMENTS = 1 << 28


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


def _flash_op_applies(q: torch.Tensor, key_pad: torch.Tensor | None) -> bool:
    """aten's FlashAttention-2 op: CUDA, fp16/bf16, no mask, head dim a multiple of 8 up to 256."""
    d = q.shape[-1]
    return q.is_cuda and key_pad is None and q.dtype in (torch.float16, torch.bfloat16) and d % 8 == 0 and d <= 256


class SdpaBackend:
    """PyTorch's fused attention: the CPU flash kernel; on CUDA aten's FlashAttention-2 op for fp16/bf16
    without a mask, else the memory-efficient kernel (the fused CUDA kernel that takes an additive mask);
    each returns the logsumexp the merge needs."""

    name = "sdpa"

    def forward(self, q, k, v, key_pad, call: BlockCall):
        bias = _key_bias(key_pad, q.dtype)
        if _flash_op_applies(q, key_pad):

            def flash(q, k, v):
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, 0.0, call.causal, False, scale=call.scale
                )[:2]

            return batch_sliced(flash, (q, k, v))
        if q.is_cuda:
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, True, 0.0, call.causal, scale=call.scale
            )
            lse = lse[..., : q.shape[2]]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, call.causal, attn_mask=bias, scale=call.scale
            )
        if key_pad is not None:  # the fused kernels report lse 0 for a row whose every key is masked
            dead = _rows_without_keys(key_pad, call.causal)
            lse = lse.masked_fill(dead, NEG_INF)
            out = out.masked_fill(dead.unsqueeze(-1), 0.0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        bias = _key_bias(key_pad, q.dtype)
        lse = lse.masked_fill(lse == NEG_INF, float("inf")).contiguous()  # empty rows: p = 0
        if _flash_op_applies(q, key_pad):
            unused = torch.empty(0, dtype=torch.int64, device=q.device)  # philox state: read only with dropout

            def flash_backward(dout, q, k, v, out, lse):
                return torch.ops.aten._scaled_dot_product_flash_attention_backward(
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

            return batch_sliced(flash_backward, (dout, q, k, v, out, lse))
        if q.is_cuda:
            # The memory-efficient backward reads `out` as if laid out (b, m, h, D) contiguously (its delta
            # pass takes the row stride as h * D), so the gathered, strided rows are copied into that layout.
            out, dout = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (out, dout))
            m = q.shape[2]
            padded = torch.nn.functional.pad(lse, (0, -(-m // 32) * 32 - m))
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], m, k.shape[2])
            zero = torch.zeros((), dtype=torch.int64, device=q.device)
            dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                dout,
                q,
                k,
                v,
                bias,
                out,
                padded,
                zero,
                zero,
                0.0,
                [True, True, True, False],
                call.causal,
                scale=call.scale,
            )
            return dq, dk, dv
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, call.causal, attn_mask=bias, scale=call.scale
        )


class FlashBackend:
    """flash-attn 2 (CUDA, fp16/bf16). Its layout is (b, m, h, D); lse is (b, h, m).

    Forward uses the public `flash_attn_func(..., return_attn_probs=True)`. Backward needs the
    internal `_flash_attn_backward` (to pass the merged out and lse); its keyword set differs across
    flash-attn 2.x releases, so the optional arguments are matched to its signature.
    """

    name = "flash"
    _OPTIONAL = {
        "window_size": (-1, -1),
        "window_size_left": -1,
        "window_size_right": -1,
        "softcap": 0.0,
        "alibi_slopes": None,
        "deterministic": False,
        "rng_state": None,
    }

    def forward(self, q, k, v, key_pad, call: BlockCall):
        if key_pad is not None:  # refused before the import, so the message is the same with or without flash-attn
            raise NotImplementedError("the flash backend takes no key_padding_mask; use backend='sdpa' or 'math'")
        from flash_attn import flash_attn_func

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

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        import inspect

        from flash_attn.flash_attn_interface import _flash_attn_backward

        t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
        dq, dk, dv = (torch.empty_like(t(x)) for x in (q, k, v))
        names = inspect.signature(_flash_attn_backward).parameters
        optional = {name: value for name, value in self._OPTIONAL.items() if name in names}
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


BACKENDS = {"math": MathBackend(), "sdpa": SdpaBackend(), "flash": FlashBackend()}


def flash_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def available_backends(device: torch.device | str) -> list[str]:
    device = torch.device(device)
    names = ["math", "sdpa"]
    if device.type == "cuda" and flash_available():
        names.append("flash")
    return names


def check_backend(requested: str, dropout_active: bool) -> None:
    """The device-independent checks of a backend choice (also made at module construction)."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend={requested!r} is unknown: use one of auto, {', '.join(BACKENDS)}")
    if requested not in ("auto", "math") and dropout_active:
        raise ValueError(
            f"backend={requested!r} cannot apply attention dropout under the exact merge: use backend='math' or 'auto'"
        )


def resolve_backend(
    requested: str, device: torch.device, dtype: torch.dtype, dropout_active: bool, key_padding: bool
) -> tuple[str, str]:
    """Pick the backend for one call: (name, reason)."""
    check_backend(requested, dropout_active)
    if requested != "auto":
        if requested == "flash" and not (device.type == "cuda" and flash_available()):
            raise ValueError(
                "backend='flash' needs CUDA and the flash-attn package: install dattn[flash] or use 'auto'"
            )
        if requested == "flash" and key_padding:
            raise ValueError("backend='flash' takes no key_padding_mask: use backend='sdpa' or 'auto'")
        return requested, "requested"
    if dropout_active:
        return "math", "dropout is active in training; only the math backend applies it exactly"
    if dtype == torch.float64 and device.type == "cuda":
        return "math", "float64 input; the fused CUDA kernels do not take float64"
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_available() and not key_padding:
        return "flash", "CUDA half precision with flash-attn installed"
    return "sdpa", f"fused PyTorch attention on {device.type}"
