"""Single-process checks: the module under test on its case's inputs (references.draw_inputs), judged against
the case's reference, computed once and shared (references.ReferenceCache)."""

from __future__ import annotations

import torch

from ..workload.build import build_module
from ..workload.problem import Problem
from .compare import DTYPES, errors_against
from .outputs import core_outputs, document_options, multihead_outputs
from .references import ReferenceCache, case_seed, draw_inputs, multihead_module
from .report import CaseResult, case_result
from .variants import Variant


def run_core(p: Problem, seed: int) -> dict[str, torch.Tensor]:
    inputs, upstream = draw_inputs(p, seed)
    module = build_module(p)
    xs = [x.requires_grad_() for x in inputs]
    documents = document_options(p)
    return core_outputs(lambda q, k, v: module.forward_with_lse(q, k, v, p.causal, **documents), xs, upstream)


def run_multihead(p: Problem, seed: int) -> dict[str, torch.Tensor]:
    """The module with weights from `seed` (references.multihead_module: the reference's, in p's dtype)."""
    module = multihead_module(p, seed)
    (x,), upstream = draw_inputs(p, seed)
    return multihead_outputs(module, x, upstream, p.causal, **document_options(p))


def check_one(v: Variant, cache: ReferenceCache) -> CaseResult:
    """One check: its reference (from the cache), the implementation's outputs, the errors."""
    try:
        reference = cache.get(v.case, v.problem)
    except Exception as exc:  # a reference that cannot be computed fails its checks, named as the reference's
        return case_result(v, failure=f"reference: {type(exc).__name__}: {exc}")
    runner = run_multihead if v.problem.spec.kind == "multihead" else run_core
    try:
        got = runner(v.problem, case_seed(v.case, cache.seed))
        errors = errors_against(got, reference, DTYPES[v.problem.dtype])
    except Exception as exc:  # a crashing implementation is a failed check, reported, not a crashed run
        return case_result(v, failure=f"{type(exc).__name__}: {exc}")
    return case_result(v, errors)
