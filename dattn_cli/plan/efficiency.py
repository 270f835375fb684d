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
  (fwd+bwd FLOPs = 1 + 2.5 of the forward's, workload/counts.py). bwd without its own curve: from fwd and fwdbwd
  curves, that mean inverted; else from the fwd curve plus the backward's memory-bound passes outside its main
  kernel (FlashAttention-2/3's bwd preprocess reads O and dO for rowsum(dO o O), the fp32 dq accumulator is zeroed,
  then read and converted to the input dtype: 3e + 8 bytes an element of B·H·N·D, BWD_PASS_BYTES) at the profile's
  memory bandwidth, which shrink against the O(N^2) work as 1/N; fwdbwd with a fwd curve only combines the two
  likewise. fwd without a curve takes the fwdbwd one. sdpa takes cuDNN's or else flash's curves, flex flash's
  (FALLBACK_KERNEL), each substitution named in the source the plan prints.
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
FALLBACK_KERNEL = {"sdpa": ("cudnn", "flash"), "flex": ("flash",)}
FALLBACK_WHY = {
    ("sdpa", "cudnn"): "torch >= 2.11 SDPA prefers cuDNN attention on sm90/sm100 (sdp_utils.cpp "
    "check_prefer_cudnn_attention)",
    ("sdpa", "flash"): "SDPA's flash backend is FlashAttention-2 (PyTorch 2.2 release notes)",
    ("flex", "flash"): "FlexAttention's generated Triton kernel tiles as FlashAttention-2 does (the FlexAttention "
    "paper, arXiv:2412.05496)",
}
TILE = 128  # query rows per thread block of FlashAttention-2/3 forward kernels (kBlockM = 128 for d <= 128)
BWD_SHARE = 2.5  # backward FLOPs per forward FLOP (fwd+bwd = 3.5 x fwd, workload/counts.py)


def bwd_pass_bytes(element: int) -> int:
    """Bytes per element of B·H·N·D the backward's passes outside its main kernel move (module docstring): O and
    dO read, the fp32 dq accumulator zeroed, read and written back in the input dtype."""
    return 3 * element + 8


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
        has = {d: bool(_matching(eff, name, dtype, causal, d)) for d in ("fwd", "bwd", "fwdbwd")}
        if has[direction]:
            return name, direction, via
        if direction == "fwdbwd" and has["fwd"] and has["bwd"]:
            return name, "fwd+bwd", via
        if direction == "bwd" and has["fwd"] and has["fwdbwd"]:
            return name, "fwdbwd-fwd", f"{via}; bwd from the fwdbwd and fwd curves"
        if direction in ("bwd", "fwdbwd") and has["fwd"]:
            return name, "fwd+passes", f"{via}; no {direction} curve: the fwd one, the bwd's memory-bound passes added"
        if direction == "fwd" and has["fwdbwd"]:
            return name, "fwdbwd", f"{via}; no fwd curve, the fwdbwd one"
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
    eff: Efficiency,
    kernel: str,
    dtype: str,
    head_dim: int,
    causal: bool,
    direction: str,
    n: int,
    in_flight: int,
    ridge: float | None = None,
) -> float | None:
    """Achieved / peak FLOP/s of `kernel` on a dense (n x n) problem with `in_flight` independent (batch x head)
    problems, times the calibrated scale of `kernel`/`direction`; None without a curve for it. `ridge`: the peak
    FLOP/s over the memory bandwidth (FLOP a byte), for a backward made from a forward curve (module docstring)."""
    route = _route(eff, kernel, dtype, causal, direction)
    if route is None:
        return None
    name, used, _ = route
    at = {
        d: _unscaled(eff, name, dtype, head_dim, causal, d, n, in_flight)
        for d in used.replace("-", "+").split("+")
        if d != "passes"
    }
    if used == "fwd+bwd":
        value = (1 + BWD_SHARE) / (1 / at["fwd"] + BWD_SHARE / at["bwd"])
    elif used == "fwdbwd-fwd":
        value = BWD_SHARE / max((1 + BWD_SHARE) / at["fwdbwd"] - 1 / at["fwd"], 1e-9)
    elif used == "fwd+passes":
        element = {"float16": 2, "bfloat16": 2}.get(dtype, 4)
        flops_per_element = BWD_SHARE * 4 * n / (2 if causal else 1)
        bwd = 1 / (1 / at["fwd"] + (ridge or 0.0) * bwd_pass_bytes(element) / flops_per_element)
        value = bwd if direction == "bwd" else (1 + BWD_SHARE) / (1 / at["fwd"] + BWD_SHARE / bwd)
    else:
        value = at[used]
    return min(1.0, scale_for(eff, kernel, direction) * value)


def curve_source(eff: Efficiency, kernel: str, dtype: str, head_dim: int, causal: bool, direction: str) -> str:
    """Where the efficiency of this kernel comes from, for the plan's note."""
    route = _route(eff, kernel, dtype, causal, direction)
    if route is None:
        return "no curve"
    name, used, via = route
    parts = [d for d in used.replace("-", "+").split("+") if d != "passes"]
    curves = [(d, curve_at(eff, name, dtype, head_dim, causal, d)) for d in parts]
    text = " + ".join(f"{name} {d}: {c.source}" for d, c in curves)
    scale = scale_for(eff, kernel, direction)
    return text + via + (f"; x{scale:.3g} (plan --calibrate)" if scale != 1.0 else "")
