"""How a check's outputs are compared with the reference.

Errors are max |impl - ref| (abs) and that divided by max |ref| (rel), ref in float64. Tolerance: fp32
and fp64 rel <= 1e-5 for out and lse, <= 1e-4 for gradients; half precisions by the flash-attn rule:
abs error vs the fp64 reference <= 2 x the abs error of a naive same-dtype dense computation + 1e-3.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .report import Error

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
HALF = (torch.float16, torch.bfloat16)

# reference(compute_dtype, src_dtype): the same outputs computed densely from inputs in src_dtype
Reference = Callable[[torch.dtype, torch.dtype], dict[str, torch.Tensor]]


def tolerance_for(dtype: torch.dtype, quantity: str) -> float:
    """Relative limit for fp32/fp64 (half precisions use the naive-error rule instead)."""
    return 1e-5 if quantity in ("out", "lse") else 1e-4


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor | None, dtype: torch.dtype) -> Error:
    got, ref = got.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(got)):
        return Error(abs=float("inf"), rel=float("inf"), limit=0.0, passed=False)
    diff = (got[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    scale = ref[finite].abs().max().item() if finite.any() else 0.0
    rel = diff / scale if scale > 0 else diff
    if dtype in HALF and naive is not None:
        naive_err = (naive.double()[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
        limit = 2 * naive_err + 1e-3
        return Error(abs=diff, rel=rel, limit=limit, passed=diff <= limit)
    limit = tolerance_for(dtype, name)
    return Error(abs=diff, rel=rel, limit=limit, passed=rel <= limit)


def errors_against(got: dict[str, torch.Tensor], reference: Reference, dtype: torch.dtype) -> dict[str, Error]:
    """Each of `got`'s quantities against the float64 reference (half precisions: and a naive one)."""
    ref = reference(torch.float64, torch.float64)
    naive = reference(dtype, dtype) if dtype in HALF else {}
    return {k: compare(k, got[k], ref[k], naive.get(k), dtype) for k in got}
