"""Attention efficiency (achieved / peak FLOP/s) of a dense kernel as a function of the sequence length and
of the blocks in flight, from curves fitted to published figures (the profile's `efficiency.attention_curves`).

    eff(N, BH) = scale x e_inf x N / (N + n_half) x wave(N, BH)

* e_inf, n_half per (kernel, head dim, causal, direction) and dtype set, each curve with its source.
  The saturating form: a kernel pays a fixed cost per row block (prologue, the softmax rescale, writing
  O and lse) and per kernel launch, while its work grows with N; causal curves have a larger n_half
  because the diagonal blocks are half wasted. Head dims between two fitted ones interpolate e_inf and
  n_half linearly in log2(head dim); outside the fitted range the nearest curve is used (no extrapolation).
* wave(N, BH) = w / ceil(w), w = BH x ceil(N / TILE) / compute units: the last wave of thread blocks
  leaves SMs idle when few (batch x heads, or short segments) are in flight. The published cells are fitted
  with this factor in, so e_inf and n_half are what is left after wave quantization.
* fwdbwd without its own curve but with fwd and bwd curves: the FLOP-weighted harmonic mean
  (fwd+bwd FLOPs = 1 + 2.5 of the forward's, workload/counts.py); else fwd <-> fwdbwd stand in for each other,
  and sdpa takes cuDNN's or else flash's curves (FALLBACK_KERNEL), each substitution named in the source the plan
  prints.
* scale: `efficiency.kernel_scale["kernel/mode"]` (or `["kernel"]`), fitted by `plan --calibrate` on GPU
  bench rows; 1 without one.

None where the profile has no curve for the kernel: the caller falls back to `attention_compute`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .profiles import AttentionCurve, Efficiency

KERNELS = ("flash", "flash3", "cudnn", "sdpa", "flex", "math")
# A kernel without curves of its own borrows these, in order, and says so. PyTorch's SDPA for fp16/bf16: on sm90/
# sm100 torch >= 2.11 (bundled cuDNN > 9.15) tries cuDNN attention first (aten/src/ATen/native/transformers/cuda/
# sdp_utils.cpp, check_prefer_cudnn_attention), so cuDNN's curves where the profile has them (Hopper); else its
# flash backend, FlashAttention-2 (PyTorch 2.2 release notes).
FALLBACK_KERNEL = {"sdpa": ("cudnn", "flash")}
FALLBACK_WHY = {
    ("sdpa", "cudnn"): "torch >= 2.11 SDPA prefers cuDNN attention on sm90/sm100 (sdp_utils.cpp "
    "check_prefer_cudnn_attention)",
    ("sdpa", "flash"): "SDPA's flash backend is FlashAttention-2 (PyTorch 2.2 release notes)",
}
TILE = 128  # query rows per thread block of FlashAttention-2/3 forward kernels (kBlockM = 128 for d <= 128)
BWD_SHARE = 2.5  # backward FLOPs per forward FLOP (fwd+bwd = 3.5 x fwd, workload/counts.py)


@dataclass(frozen=True)
class Curve:
    """The parameters at one head dim (interpolated where needed) and where they come from."""

    e_inf: float
    n_half: float
    source: str


def saturation(n: float, e_inf: float, n_half: float) -> float:
    return e_inf * n / (n + n_half)


def wave_factor(n: int, in_flight: int, units: int | None, tile: int = TILE) -> float:
    """Share of the busy SM-time that is useful: w / ceil(w) for w = in_flight x ceil(n/tile) / units."""
    if not units:
        return 1.0
    waves = in_flight * math.ceil(n / tile) / units
    return waves / math.ceil(waves)


def _matching(eff: Efficiency, kernel: str, dtype: str, causal: bool, direction: str) -> list[AttentionCurve]:
    return sorted(
        (
            c
            for c in eff.attention_curves
            if c.kernel == kernel and c.causal == causal and c.direction == direction and dtype in c.dtypes
        ),
        key=lambda c: c.head_dim,
    )


def curve_at(eff: Efficiency, kernel: str, dtype: str, head_dim: int, causal: bool, direction: str) -> Curve | None:
    """The curve at `head_dim`: exact, interpolated in log2(head dim) between the two nearest, or the nearest."""
    curves = _matching(eff, kernel, dtype, causal, direction)
    if not curves:
        return None
    lower = [c for c in curves if c.head_dim <= head_dim]
    upper = [c for c in curves if c.head_dim >= head_dim]
    if not lower or not upper:
        c = upper[0] if not lower else lower[-1]
        return Curve(c.e_inf, c.n_half, f"{c.source} (d={c.head_dim}, nearest fitted head dim)")
    lo, hi = lower[-1], upper[0]
    if lo.head_dim == hi.head_dim:
        return Curve(lo.e_inf, lo.n_half, lo.source)
    t = (math.log2(head_dim) - math.log2(lo.head_dim)) / (math.log2(hi.head_dim) - math.log2(lo.head_dim))
    return Curve(
        lo.e_inf + t * (hi.e_inf - lo.e_inf),
        lo.n_half + t * (hi.n_half - lo.n_half),
        f"{lo.source}; interpolated between d={lo.head_dim} and d={hi.head_dim}",
    )


def _route(eff: Efficiency, kernel: str, dtype: str, causal: bool, direction: str) -> tuple[str, str, str] | None:
    """(kernel, direction, note) of the curve that stands for `kernel`/`direction`, trying in order: its own; for
    fwdbwd, its fwd and bwd curves combined ("fwd+bwd"); its other direction (fwd <-> fwdbwd: the same kernel's
    level beats a constant prior); the same in FALLBACK_KERNEL's curves. Never across causal: causal curves
    start far lower. None: no curve, the prior applies."""
    for name in (kernel, *FALLBACK_KERNEL.get(kernel, ())):
        via = "" if name == kernel else f"; {kernel} has no curve here, {name}'s: {FALLBACK_WHY[kernel, name]}"
        if _matching(eff, name, dtype, causal, direction):
            return name, direction, via
        if direction == "fwdbwd" and all(_matching(eff, name, dtype, causal, d) for d in ("fwd", "bwd")):
            return name, "fwd+bwd", via
        other = {"fwd": "fwdbwd", "fwdbwd": "fwd"}.get(direction)
        if other and _matching(eff, name, dtype, causal, other):
            return name, other, f"{via}; no {direction} curve, the {other} one"
    return None


def has_curve(eff: Efficiency, kernel: str, dtype: str, causal: bool, direction: str) -> bool:
    return _route(eff, kernel, dtype, causal, direction) is not None


def scale_for(eff: Efficiency, kernel: str, direction: str) -> float:
    return eff.kernel_scale.get(f"{kernel}/{direction}", eff.kernel_scale.get(kernel, 1.0))


def _unscaled(
    eff: Efficiency, kernel: str, dtype: str, head_dim: int, causal: bool, direction: str, n: int, in_flight: int
) -> float:
    """The curve's efficiency without the calibrated scale (the caller has found a curve: _route)."""
    curve = curve_at(eff, kernel, dtype, head_dim, causal, direction)
    return saturation(n, curve.e_inf, curve.n_half) * wave_factor(n, in_flight, eff.compute_units)


def curve_efficiency(
    eff: Efficiency, kernel: str, dtype: str, head_dim: int, causal: bool, direction: str, n: int, in_flight: int
) -> float | None:
    """Achieved / peak FLOP/s of `kernel` on a dense (n x n) problem with `in_flight` independent (batch x head)
    problems, times the calibrated scale of `kernel`/`direction`; None without a curve for it."""
    route = _route(eff, kernel, dtype, causal, direction)
    if route is None:
        return None
    name, used, _ = route
    if used == "fwd+bwd":
        fwd, bwd = (_unscaled(eff, name, dtype, head_dim, causal, d, n, in_flight) for d in ("fwd", "bwd"))
        value = (1 + BWD_SHARE) / (1 / fwd + BWD_SHARE / bwd)
    else:
        value = _unscaled(eff, name, dtype, head_dim, causal, used, n, in_flight)
    return min(1.0, scale_for(eff, kernel, direction) * value)


def curve_source(eff: Efficiency, kernel: str, dtype: str, head_dim: int, causal: bool, direction: str) -> str:
    """Where the efficiency of this kernel comes from, for the plan's note."""
    route = _route(eff, kernel, dtype, causal, direction)
    if route is None:
        return "no curve"
    name, used, via = route
    parts = ("fwd", "bwd") if used == "fwd+bwd" else (used,)
    curves = [(d, curve_at(eff, name, dtype, head_dim, causal, d)) for d in parts]
    text = " + ".join(f"{name} {d}: {c.source}" for d, c in curves)
    scale = scale_for(eff, kernel, direction)
    return text + via + (f"; x{scale:.3g} (plan --calibrate)" if scale != 1.0 else "")
