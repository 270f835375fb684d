"""Rotary position embedding (Su et al., "RoFormer", 2021): rotates q and k by position-dependent angles,
so attention scores depend on relative positions and any sequence length works without a learned table."""

from __future__ import annotations

import torch

from .backends import accumulator_dtype


def document_positions(cu_seqlens: torch.Tensor, offset: int, n: int, device: torch.device) -> torch.Tensor:
    """Positions of rows offset .. offset + n - 1 of packed documents counted from their document's first token
    (each document as a separate sequence), float64."""
    bounds = cu_seqlens.to(device=device, dtype=torch.int64)
    if offset + n > int(bounds[-1]):
        raise ValueError(
            f"cu_seqlens ends at {int(bounds[-1])} but the rows run to {offset + n}: pass the whole "
            "sequence's cu_seqlens (on every rank) and the shard's position_offset"
        )
    rows = torch.arange(offset, offset + n, device=device, dtype=torch.int64)
    starts = bounds[torch.searchsorted(bounds, rows, right=True) - 1]
    return (rows - starts).to(torch.float64)


def apply_rotary(
    x: torch.Tensor, offset: int = 0, base: float = 10000.0, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """x (B, N, H, D) with even D -> x rotated pairwise (first half, second half) by angle
    (offset + position) · base^(-2i/D); the rotation in fp32 (fp64 for fp64 x, so a float64 model stays a float64
    reference), returned in x's dtype. The angles and their cos/sin are taken in fp64: in fp32 the angles at
    position 10^6 are off by up to 0.02 rad and a position past 2^24 is not even an integer (a sequence shard far
    into a long sequence has such offsets). positions: float64 (N,) positions instead (packed documents)."""
    n, d = x.shape[1], x.shape[-1]
    if d % 2:
        raise ValueError(f"rotary embeddings need an even head_dim, got {d}: use an even head_dim or rotary=False")
    compute = accumulator_dtype(x.dtype)
    inv_freq = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    if positions is None:
        positions = torch.arange(offset, offset + n, device=x.device, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)
    cos, sin = (f(angles).to(compute)[None, :, None, :] for f in (torch.cos, torch.sin))
    x1, x2 = x.to(compute).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)
