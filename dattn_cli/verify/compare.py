"""How a check's outputs are judged: the tolerance policy of docs/verify.md.

For each quantity X (out, lse, dq, dk, dv; a multihead module's out, dx, dparams):

    err(X) = max |X - X_ref| / max |X_ref|

over the entries where the float64 reference X_ref is finite (an entry finite in one and not in the other
fails the check). An implementation in dtype T passes X when

    err(impl) <= FACTOR x err(naive) + FLOOR

with `naive` the same reference computation done in T (its inputs, arithmetic and gradients in T, no higher
precision accumulation than the dtype's matmul gives): what T costs a straightforward computation. This is
flash-attn's tests' rule (`(out - out_ref).abs().max() <= 2 * (out_pt - out_ref).abs().max()`), taken relative
to the reference's size so that one limit holds at every N, plus a floor for the ulp-level differences of
summation order. In float64 the naive computation is the reference (err 0) and the floor decides.
"""

from __future__ import annotations

import math

import torch

from .report import Error

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
FACTOR = 2.0
FLOOR = {"value": 1e-5, "gradient": 1e-4}  # out, lse / dq, dk, dv, dx, dparams: relative to max |X_ref|
STEP = 1 << 22  # elements compared at a time: the comparison holds a few float64 slices, not copies of X


def floor_for(quantity: str) -> float:
    return FLOOR["gradient" if quantity.startswith("d") else "value"]


def tolerance_for(dtype: torch.dtype, quantity: str, naive: float = 0.0) -> float:
    """The limit on err(impl) for `quantity` given the naive computation's error in `dtype`."""
    return FACTOR * naive + floor_for(quantity)


def max_errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |got - ref|, max |ref|) over ref's finite entries, a slice at a time; (inf, .) when got and ref
    are not finite at the same entries."""
    got, ref = got.detach().reshape(-1), ref.detach().reshape(-1)
    if got.numel() != ref.numel():
        return float("inf"), 0.0
    diff = scale = 0.0
    for i in range(0, ref.numel(), STEP):
        g, r = got[i : i + STEP], ref[i : i + STEP].double()
        low, high = torch.aminmax(r)
        d = torch.sub(g, r).abs_().max().item()  # float64 by promotion: no copy of g
        if math.isfinite(low.item()) and math.isfinite(high.item()) and math.isfinite(d):
            # all of r finite (min and max propagate nan) and g - r finite: so is all of g
            diff, scale = max(diff, d), max(scale, -low.item(), high.item())
            continue
        g = g.double()
        finite = torch.isfinite(r)
        if not torch.equal(finite, torch.isfinite(g)):
            return float("inf"), scale
        if finite.any():
            diff = max(diff, torch.where(finite, (g - r).abs(), 0.0).max().item())
            scale = max(scale, torch.where(finite, r.abs(), 0.0).max().item())
    return diff, scale


def relative(diff: float, scale: float) -> float:
    return diff / scale if scale > 0 else diff


def judge(quantity: str, got: torch.Tensor, ref: torch.Tensor, naive: float, dtype: torch.dtype) -> Error:
    diff, scale = max_errors(got, ref)
    rel = relative(diff, scale)
    limit = tolerance_for(dtype, quantity, naive)
    return Error(abs=diff, rel=rel, naive=naive, limit=limit, passed=math.isfinite(rel) and rel <= limit)


def naive_errors(naive: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """err(naive) per quantity."""
    return {k: relative(*max_errors(naive[k], ref[k])) for k in ref}


def errors_against(got: dict[str, torch.Tensor], reference, dtype: torch.dtype) -> dict[str, Error]:
    """Each of `got`'s quantities against the reference (a references.Reference: float64 outputs and the naive
    computation's errors)."""
    return {k: judge(k, got[k], reference.outputs[k], reference.naive[k], dtype) for k in got}
