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

import torch

from .block_kernels import (
    KERNELS,
    BlockCall as BlockCall,
    MathBackend as MathBackend,
    accumulator_dtype as accumulator_dtype,
    half_without_mask,
    note_used,
    takes_view,
)
from .flash_kernels import flash_installs
from .kernel_choice import choose_kernel

NEG_INF = float("-inf")


def _rows_without_keys(key_pad: torch.Tensor, causal: bool) -> torch.Tensor:
    """(b, 1, m) or (b, 1, 1) bool: query rows that no unmasked key is offered to (causal blocks are
    square: none at or before the row; otherwise: every key of the block masked)."""
    if causal:
        dead = (~key_pad).cumsum(dim=-1) == 0
    else:
        dead = key_pad.all(dim=-1, keepdim=True)
    return dead.unsqueeze(1)


def _empty_rows_inf(lse: torch.Tensor) -> torch.Tensor:
    """The merged lse as a contiguous tensor for a kernel's backward, +inf where it is -inf (a row with no key:
    p = exp(s - inf) = 0); one pass (NaN stays NaN)."""
    return lse.nan_to_num(nan=float("nan"), neginf=float("inf")).contiguous()


def _run(name: str):
    """The kernel object of `name` (math: the math backend), noted as used."""
    note_used(name)
    return KERNELS[name]


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
        lse = _empty_rows_inf(lse)
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
        lse = _empty_rows_inf(lse)
        return _run(self.kernel(q, False)).backward(dout, q, k, v, out, lse, None, call)


BACKENDS = {"math": KERNELS["math"], "sdpa": SdpaBackend(), "flash": FlashBackend()}


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
