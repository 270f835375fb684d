"""The one merge routine: combine partial attention results over disjoint sets of keys.

Given (out_a, lse_a) over key set A and (out_b, lse_b) over key set B, the attention over A ∪ B is

    lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b

Every implementation uses it: dilated pairs, ring steps and gathered blocks alike. A key offered by two
pairs appears in both partial results, which is exactly the count c_h(t, u) of docs/semantics.md.
Rows with lse = −inf (no key yet) contribute nothing and never produce NaN.

`merge_partial_` and `accumulate_` (the gradient shares' sum) each run as one fused Triton pass where
merge_fused.py says it applies (CUDA, fp32 accumulators; DATTN_FUSED_MERGE=0 turns it off), and as the
torch code below everywhere else.
"""

from __future__ import annotations

import torch

from . import merge_fused

NEG_INF = float("-inf")


def merge_partial_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Merge (block_out, block_lse) into (out, lse) in place.

    out, block_out: (..., D); lse, block_lse: (...). `out`/`lse` may be strided views into larger
    accumulators; `block_out` is consumed (scaled in place) to avoid a temporary.
    """
    if merge_fused.merge_(out, lse, block_out, block_lse):
        return
    new_lse = torch.logaddexp(lse, block_lse)
    # exp(x - (-inf)) would be NaN where both sides are empty: measure such rows against 0 instead.
    base = new_lse.masked_fill(new_lse == NEG_INF, 0.0)
    if block_out.dtype != out.dtype:  # half-precision block into an fp32 accumulator: scale in fp32
        block_out = block_out.to(out.dtype)
    block_out.mul_(torch.exp(block_lse - base).unsqueeze(-1))
    out.mul_(torch.exp(lse - base).unsqueeze(-1)).add_(block_out)
    lse.copy_(new_lse)


def accumulate_(acc: torch.Tensor, value: torch.Tensor) -> None:
    """acc += value in place, value cast to acc's dtype; `acc` may be a strided view of an accumulator."""
    if not merge_fused.accumulate_(acc, value):
        acc.add_(value)


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place form of `merge_partial_`, differentiable through both inputs (the weights too)."""
    new_lse = torch.logaddexp(lse_a, lse_b)
    base = new_lse.masked_fill(new_lse == NEG_INF, 0.0)
    out = torch.exp(lse_a - base).unsqueeze(-1) * out_a + torch.exp(lse_b - base).unsqueeze(-1) * out_b
    return out, new_lse
