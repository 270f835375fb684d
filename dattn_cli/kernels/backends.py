"""Attention backends for one block: dense attention on (b, h, m, D) that returns (out, lse).

Each backend offers `forward` and `backward`. The backward takes the *merged* out and lse of the rows
(not the block's own), which makes the per-block gradients sum to the exact gradient of the merged
result (the technique ring attention uses); see engine.py.

* math  — plain PyTorch matmuls, any device, any dtype, dropout; chunked over b to bound scores.
* sdpa  — PyTorch's fused kernels through the aten ops that return the logsumexp: cpu-flash on CPU; on CUDA
          cuDNN or FlashAttention-2 for fp16/bf16 without a mask (the faster by a cached probe), else the
          memory-efficient kernel.
* flash — the flash packages (CUDA, fp16/bf16, no mask): FlashAttention-4 or flash-attn 2, when installed.

The kernels themselves are in block_kernels.py, the choice among them in kernel_choice.py. Each backend also
says whether a strided block reaches its kernel as a view (`takes_view`, the rule in block_kernels.takes_view).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .block_kernels import KERNELS, flash_installs, half_without_mask, key_bias, note_used, takes_view
from .kernel_choice import choose_kernel

NEG_INF = float("-inf")
MATH_SCORE_BUDGET_BYTES = 1 << 28


@dataclass(frozen=True)
class BlockCall:
    """What one backend call needs besides the tensors."""

    causal: bool
    scale: float
    dropout_p: float = 0.0
    seed: int = 0


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

    def takes_view(self, x: torch.Tensor, masked: bool) -> bool:
        return takes_view("math", x)

    def _chunks(self, q: torch.Tensor):
        b, h, m, _ = q.shape
        per_item = max(1, h * m * m * 4 * 3)
        step = max(1, MATH_SCORE_BUDGET_BYTES // per_item)
        return [slice(i, min(b, i + step)) for i in range(0, b, step)]

    def _scores(self, q, k, key_pad, call: BlockCall, rows: slice) -> torch.Tensor:
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        s = torch.matmul(q[rows].to(acc), k[rows].to(acc).transpose(-1, -2)).mul_(call.scale)
        bias = key_bias(None if key_pad is None else key_pad[rows], acc)
        if bias is not None:
            s.add_(bias)
        if call.causal:
            m = q.shape[2]
            s.masked_fill_(torch.ones(m, m, dtype=torch.bool, device=q.device).triu_(1), NEG_INF)
        return s

    def _dropout_scale(self, shape, call: BlockCall, rows: slice, device) -> torch.Tensor:
        gen = torch.Generator(device=device)
        gen.manual_seed(call.seed + rows.start)
        keep = torch.rand(shape, generator=gen, device=device) >= call.dropout_p
        return keep.float() / (1.0 - call.dropout_p)

    def forward(self, q, k, v, key_pad, call: BlockCall):
        out = torch.empty_like(q)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        lse = torch.empty(q.shape[:3], dtype=lse_dtype, device=q.device)
        for rows in self._chunks(q):
            s = self._scores(q, k, key_pad, call, rows)
            block_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            p = torch.exp(s - block_lse.masked_fill(block_lse == NEG_INF, 0.0))
            if call.dropout_p > 0:
                p.mul_(self._dropout_scale(p.shape, call, rows, q.device))
            out[rows] = torch.matmul(p, v[rows].to(p.dtype)).to(q.dtype)
            lse[rows] = block_lse.squeeze(-1)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for rows in self._chunks(q):
            s = self._scores(q, k, key_pad, call, rows)
            row_lse = lse[rows].unsqueeze(-1).to(s.dtype)
            p = torch.exp(s - row_lse.masked_fill(row_lse == NEG_INF, float("inf")))
            do, o = dout[rows].to(s.dtype), out[rows].to(s.dtype)
            dp = torch.matmul(do, v[rows].to(s.dtype).transpose(-1, -2))
            if call.dropout_p > 0:
                keep = self._dropout_scale(p.shape, call, rows, q.device)
                dv[rows] = torch.matmul((p * keep).transpose(-1, -2), do).to(v.dtype)
                dp.mul_(keep)
            else:
                dv[rows] = torch.matmul(p.transpose(-1, -2), do).to(v.dtype)
            delta = (do * o).sum(-1, keepdim=True)
            ds = p.mul_(dp.sub_(delta)).mul_(call.scale)
            dq[rows] = torch.matmul(ds, k[rows].to(s.dtype)).to(q.dtype)
            dk[rows] = torch.matmul(ds.transpose(-1, -2), q[rows].to(s.dtype)).to(k.dtype)
        return dq, dk, dv


def _run(name: str):
    """The kernel object of `name` (math: the math backend), noted as used."""
    note_used(name)
    return BACKENDS["math"] if name == "math" else KERNELS[name]


class SdpaBackend:
    """PyTorch's fused attention: the CPU flash kernel; on CUDA, for fp16/bf16 without a mask, the faster of the
    cuDNN and FlashAttention-2 ops by the probe (kernel_choice.py), else the memory-efficient kernel (the fused
    CUDA kernel that takes an additive mask); each returns the logsumexp the merge needs."""

    name = "sdpa"

    def kernel(self, q: torch.Tensor, masked: bool) -> str:
        if not q.is_cuda:
            return "cpu-flash"
        if half_without_mask(q, masked):
            return choose_kernel("sdpa", q.device, q.dtype, q.shape[-1])
        return "efficient"

    def takes_view(self, x: torch.Tensor, masked: bool) -> bool:
        return takes_view(self.kernel(x, masked), x)

    def forward(self, q, k, v, key_pad, call: BlockCall):
        out, lse = _run(self.kernel(q, key_pad is not None)).forward(q, k, v, key_pad, call)
        if key_pad is not None:  # the fused kernels report lse 0 for a row whose every key is masked
            dead = _rows_without_keys(key_pad, call.causal)
            lse = lse.masked_fill(dead, NEG_INF)
            out = out.masked_fill(dead.unsqueeze(-1), 0.0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        lse = lse.masked_fill(lse == NEG_INF, float("inf")).contiguous()  # empty rows: p = 0
        return _run(self.kernel(q, key_pad is not None)).backward(dout, q, k, v, out, lse, key_pad, call)


class FlashBackend:
    """The flash packages (CUDA, fp16/bf16, no mask): FlashAttention-4 (`flash_attn.cute`) or the flash-attn 2
    package, the faster by the probe where both are installed (block_kernels.py runs them)."""

    name = "flash"

    def kernel(self, q: torch.Tensor, masked: bool) -> str:
        return choose_kernel("flash", q.device, q.dtype, q.shape[-1])

    def takes_view(self, x: torch.Tensor, masked: bool) -> bool:
        return takes_view(self.kernel(x, masked), x)

    def forward(self, q, k, v, key_pad, call: BlockCall):
        if key_pad is not None:  # refused before the import, so the message is the same with or without flash-attn
            raise NotImplementedError("the flash backend takes no key_padding_mask; use backend='sdpa' or 'math'")
        return _run(self.kernel(q, False)).forward(q, k, v, None, call)

    def backward(self, dout, q, k, v, out, lse, key_pad, call: BlockCall):
        lse = lse.masked_fill(lse == NEG_INF, float("inf")).contiguous()  # empty rows: p = 0
        return _run(self.kernel(q, False)).backward(dout, q, k, v, out, lse, None, call)


BACKENDS = {"math": MathBackend(), "sdpa": SdpaBackend(), "flash": FlashBackend()}


def flash_usable(device: torch.device | str) -> bool:
    """The flash backend can run on `device`: CUDA and a flash package (FA4 or FA2) installed."""
    installs = flash_installs()
    return torch.device(device).type == "cuda" and torch.cuda.is_available() and (installs.fa2 or installs.fa4)


def available_backends(device: torch.device | str) -> list[str]:
    return ["math", "sdpa", *(["flash"] if flash_usable(device) else [])]


def check_backend(requested: str, dropout_active: bool) -> None:
    """The device-independent checks of a backend choice (also made at module construction)."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend={requested!r} is unknown: use one of auto, {', '.join(BACKENDS)}")
    if requested not in ("auto", "math") and dropout_active:
        raise ValueError(
            f"backend={requested!r} cannot apply attention dropout under the exact merge: use backend='math' or 'auto'"
        )


def resolve_backend(
    requested: str,
    device: torch.device,
    dtype: torch.dtype,
    dropout_active: bool,
    key_padding: bool,
    head_dim: int | None = None,
) -> tuple[str, str]:
    """Pick the backend for one call: (name, reason). With `head_dim`, `auto` on CUDA fp16/bf16 without a mask
    takes the backend of the fastest kernel of all (kernel_choice.choose_kernel, probed once and cached)."""
    check_backend(requested, dropout_active)
    if requested != "auto":
        if requested == "flash" and not flash_usable(device):
            raise ValueError(
                "backend='flash' needs CUDA and flash-attn-4 or flash-attn: install dattn[flash] or use 'auto'"
            )
        if requested == "flash" and key_padding:
            raise ValueError("backend='flash' takes no key_padding_mask: use backend='sdpa' or 'auto'")
        return requested, "requested"
    if dropout_active:
        return "math", "dropout is active in training; only the math backend applies it exactly"
    if dtype == torch.float64 and device.type == "cuda":
        return "math", "float64 input; the fused CUDA kernels do not take float64"
    half = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and not key_padding
    if half and head_dim is not None and head_dim % 8 == 0 and head_dim <= 256:
        kernel = choose_kernel("auto", device, dtype, head_dim)
        backend = "flash" if kernel in ("fa4", "flash-attn2") else "sdpa"
        return backend, f"CUDA half precision: block kernel {kernel}, the fastest measured (or DATTN_BLOCK_KERNEL)"
    if half and flash_usable(device):
        return "flash", "CUDA half precision with a flash package installed"
    return "sdpa", f"fused PyTorch attention on {device.type}"
