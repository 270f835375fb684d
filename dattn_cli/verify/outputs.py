"""What one check computes, the same way in the single-process run, on every rank of a distributed one
and for the reference: a core's out, lse and dq/dk/dv, or a multihead module's out, dx and parameter
gradients (flattened into one vector, so ranks' gradients sum as DDP's all-reduce would)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..workload.problem import Problem

CORE_KEYS = ("out", "lse", "dq", "dk", "dv")


def _grads(outputs: torch.Tensor, inputs: list[torch.Tensor], upstream: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(outputs, inputs, upstream.to(outputs.dtype)))


def core_outputs(
    call: Callable[..., tuple[torch.Tensor, torch.Tensor]], inputs: list[torch.Tensor], upstream: torch.Tensor
) -> dict[str, torch.Tensor]:
    """out and lse of call(q, k, v), and the gradients of q, k, v under `upstream`."""
    out, lse = call(*inputs)
    dq, dk, dv = _grads(out, inputs, upstream)
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def multihead_outputs(
    module: nn.Module, x: torch.Tensor, upstream: torch.Tensor, causal: bool, **options
) -> dict[str, torch.Tensor]:
    """Self-attention of x: out, and the gradients of x and of every parameter under `upstream`; `options` go
    to the call (a padded shard's key_padding_mask)."""
    x = x.clone().requires_grad_()
    out, _ = module(x, x, x, is_causal=causal, **options)
    grads = _grads(out, [x, *module.parameters()], upstream)
    return {"out": out.detach(), "dx": grads[0], "dparams": torch.cat([g.flatten().double() for g in grads[1:]])}


def document_options(p: Problem) -> dict:
    """The cu_seqlens keyword of a whole-sequence call of p's packed documents (none without)."""
    if p.documents is None:
        return {}
    from ..kernels.documents import offsets

    return {"cu_seqlens": offsets(p.documents)}


class ReferenceCore(nn.Module):
    """Stands in for a multihead module's core: that core's own dense reference, differentiable (tests use it;
    verify uses references.PatternReference, the Problem's reference)."""

    def __init__(self, core: nn.Module, compute_dtype: torch.dtype):
        super().__init__()
        self.core, self.compute_dtype = core, compute_dtype

    def forward(self, q, k, v, is_causal=False, key_padding_mask=None, **documents):
        return self.core.reference(
            q, k, v, is_causal, key_padding_mask=key_padding_mask, compute_dtype=self.compute_dtype, **documents
        )[0]
