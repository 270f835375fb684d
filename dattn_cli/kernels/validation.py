"""Input checks shared by the reference and every implementation: one clear ValueError each."""

from __future__ import annotations

import torch

from .heads import kv_group


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (batch, seq_len, heads, head_dim)")
        if x.dim() != 4:
            raise ValueError(
                f"{name} has {x.dim()} dimensions, shape {tuple(x.shape)}: pass (batch, seq_len, heads, head_dim)"
            )
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"q, k, v shapes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            "self-attention needs equal (batch, seq_len, head_dim), and k, v equal shapes"
        )
    kv_group(q.shape[2], k.shape[2])
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}; cast them to one dtype")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}; move them to one")
    if not q.is_floating_point():
        raise ValueError(f"q, k, v have dtype {q.dtype}: use a floating-point dtype")
    if 0 in q.shape:
        raise ValueError(f"q has an empty dimension, shape {tuple(q.shape)}: every dimension must be >= 1")


def check_key_padding_mask(mask: torch.Tensor | None, batch: int, seq_len: int, device: torch.device) -> None:
    if mask is None:
        return
    if mask.dtype != torch.bool or tuple(mask.shape) != (batch, seq_len):
        raise ValueError(
            f"key_padding_mask must be a bool tensor of shape ({batch}, {seq_len}) with True = ignore that key, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    if mask.device != device:
        raise ValueError(f"key_padding_mask is on {mask.device} but q is on {device}: move it to {device}")
