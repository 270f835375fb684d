"""Single-process checks: the module under test and the dense reference on the same inputs, one shared
generator drawing every check's inputs (and multihead weight seeds) in run order."""

from __future__ import annotations

import copy

import torch

from ..workload.build import build_module
from ..workload.problem import Problem
from .compare import DTYPES, Reference, errors_against
from .outputs import ReferenceCore, core_outputs, document_options, draw_inputs, multihead_outputs
from .report import CaseResult, case_result
from .variants import Variant
from .weights import seeded_multihead


def run_core(p: Problem, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], Reference]:
    dtype = DTYPES[p.dtype]
    base, upstream = draw_inputs(p, gen)
    module = build_module(p)
    inputs = [x.to(dtype).requires_grad_() for x in base]
    documents = document_options(p)
    got = core_outputs(lambda q, k, v: module.forward_with_lse(q, k, v, p.causal, **documents), inputs, upstream)

    def reference(compute_dtype: torch.dtype, src_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        xs = [x.to(src_dtype).requires_grad_() for x in base]
        return core_outputs(
            lambda q, k, v: module.reference(q, k, v, p.causal, compute_dtype=compute_dtype, **documents), xs, upstream
        )

    return got, reference


def run_multihead(p: Problem, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], Reference]:
    """Weights seeded from `gen` and built in float32 (then cast to the checked dtype); the reference is a
    copy of the cast module with its core replaced by the dense reference."""
    dtype = DTYPES[p.dtype]
    seed = int(torch.randint(1 << 30, (1,), generator=gen))
    module = seeded_multihead(p, seed, torch.float32).to(p.device)
    (x,), upstream = draw_inputs(p, gen)
    got = multihead_outputs(module.to(dtype), x.to(dtype), upstream, p.causal, **document_options(p))

    def reference(compute_dtype: torch.dtype, src_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        ref = copy.deepcopy(module).to(src_dtype)
        ref.attention = ReferenceCore(module.attention, compute_dtype)
        return multihead_outputs(ref, x.to(src_dtype), upstream, p.causal, **document_options(p))

    return got, reference


def check_one(v: Variant, gen: torch.Generator) -> CaseResult:
    runner = run_multihead if v.problem.spec.kind == "multihead" else run_core
    try:
        got, reference = runner(v.problem, gen)
        errors = errors_against(got, reference, DTYPES[v.problem.dtype])
    except Exception as exc:  # a crashing implementation is a failed check, reported, not a crashed run
        return case_result(v, failure=f"{type(exc).__name__}: {exc}")
    return case_result(v, errors)
