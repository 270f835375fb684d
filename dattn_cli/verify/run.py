"""Run implementations against the reference and report per-case errors.

Errors are max |impl - ref| (abs) and that divided by max |ref| (rel), ref in float64. Tolerance: fp32
and fp64 rel <= 1e-5 for out and lse, <= 1e-4 for gradients; half precisions by the flash-attn rule:
abs error vs the fp64 reference <= 2 x the abs error of a naive same-dtype dense computation + 1e-3.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable

import torch
from pydantic import BaseModel
from torch import nn

from ..kernels.backends import available_backends
from ..kernels.pattern import uncovered_fraction
from ..kernels.registry import REGISTRY, Implementation
from ..kernels.block_sparse.patterns import PATTERNS
from .build import build_core, build_multihead
from .cases import VerifyCase, case_matrix

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
HALF = (torch.float16, torch.bfloat16)


class Error(BaseModel):
    abs: float
    rel: float
    limit: float
    passed: bool


class CaseResult(BaseModel):
    impl: str
    world_size: int = 1
    case: str
    backend: str
    semantics: str
    causal: bool
    dtype: str
    device: str
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    segment_lengths: list[int]
    dilation_rates: list[int]
    uncovered_fraction: float
    pattern: str | None = None  # block-sparse implementations: the block pattern checked
    errors: dict[str, Error]
    passed: bool
    message: str = ""
    comm: list[dict[str, int]] | None = None  # distributed runs: each rank's comm_stats()


class VerifyReport(BaseModel):
    results: list[CaseResult]
    passed: bool
    seed: int
    skipped: list[str] = []  # distributed cases a world size cannot shard, and why
    environment: dict | None = None  # filled by the CLI: versions, devices, command line

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]


def tolerance_for(dtype: torch.dtype, quantity: str) -> float:
    """Relative limit for fp32/fp64 (half precisions use the naive-error rule instead)."""
    return 1e-5 if quantity in ("out", "lse") else 1e-4


def _compare(name: str, got: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor | None, dtype: torch.dtype) -> Error:
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


class _ReferenceAttention(nn.Module):
    """Stands in for a multihead module's core: the dense reference, differentiable."""

    def __init__(self, core: nn.Module, compute_dtype: torch.dtype):
        super().__init__()
        self.core, self.compute_dtype = core, compute_dtype

    def forward(self, q, k, v, is_causal=False, key_padding_mask=None):
        return self.core.reference(q, k, v, is_causal, key_padding_mask=key_padding_mask, compute_dtype=self.compute_dtype)[0]


def _grads(outputs: torch.Tensor, inputs: list[torch.Tensor], upstream: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(outputs, inputs, upstream.to(outputs.dtype)))


def _run_core(impl: Implementation, case: VerifyCase, semantics, causal, backend, dtype, device, gen, pattern):
    shape = (case.batch, case.seq_len, case.heads, case.head_dim)
    base = [torch.randn(shape, generator=gen, dtype=torch.float64).to(device) for _ in range(3)]
    upstream = torch.randn(shape, generator=gen, dtype=torch.float64).to(device)
    module = build_core(impl.name, case, semantics, backend, pattern)
    inputs = [x.to(dtype).requires_grad_() for x in base]
    out, lse = module.forward_with_lse(*inputs, causal)
    got = {"out": out, "lse": lse, **dict(zip(("dq", "dk", "dv"), _grads(out, inputs, upstream)))}

    def reference(compute_dtype, src_dtype):
        xs = [x.to(src_dtype).requires_grad_() for x in base]
        o, l = module.reference(*xs, causal, compute_dtype=compute_dtype)
        return {"out": o, "lse": l, **dict(zip(("dq", "dk", "dv"), _grads(o, xs, upstream)))}

    return got, reference


def _run_multihead(impl: Implementation, case: VerifyCase, semantics, causal, backend, dtype, device, gen, pattern):
    embed = case.heads * case.head_dim
    seed = int(torch.randint(1 << 30, (1,), generator=gen))
    module = build_multihead(impl.name, case, semantics, backend, seed, pattern, dtype=torch.float32).to(device)
    x64 = torch.randn(case.batch, case.seq_len, embed, generator=gen, dtype=torch.float64).to(device)
    upstream = torch.randn(case.batch, case.seq_len, embed, generator=gen, dtype=torch.float64).to(device)

    def run(mod, src_dtype):
        x = x64.to(src_dtype).requires_grad_()
        out, _ = mod(x, x, x, is_causal=causal)
        params = [p for _, p in mod.named_parameters()]
        grads = _grads(out, [x, *params], upstream)
        return {"out": out, "dx": grads[0], "dparams": torch.cat([g.flatten().double() for g in grads[1:]])}

    got = run(module.to(dtype), dtype)

    def reference(compute_dtype, src_dtype):
        ref = copy.deepcopy(module).to(src_dtype)
        ref.attention = _ReferenceAttention(module.attention, compute_dtype)
        return run(ref, src_dtype)

    return got, reference


def run_verify(
    impls: Iterable[str] | None = None,
    *,
    world_sizes: Iterable[int] = (1,),
    dist_timeout_s: float = 120.0,
    full: bool = False,
    dtype: str = "float32",
    semantics: Iterable[str] = ("longnet", "head_groups"),
    causal: Iterable[bool] = (False, True),
    backends: Iterable[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    cases: list[VerifyCase] | None = None,
    patterns: Iterable[str] = PATTERNS,
    on_result: Callable[[CaseResult], None] | None = None,
) -> VerifyReport:
    """Check each implementation x case x semantics x causal x backend against the reference."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown: use one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    world_sizes = sorted(set(world_sizes))
    if any(w < 1 for w in world_sizes):
        raise ValueError(f"--world-size values must be >= 1, got {world_sizes}")
    distributed_run = world_sizes != [1]
    names = list(impls) if impls else [
        n for n, i in REGISTRY.items() if (i.distributed if distributed_run else i.single_device)
    ]
    patterns, semantics, causal = list(patterns), list(semantics), list(causal)
    for pattern in patterns:
        if pattern not in PATTERNS:
            raise ValueError(f"--pattern {pattern!r} is unknown: use one of {', '.join(PATTERNS)}")
    for name in names:
        if name not in REGISTRY:
            raise ValueError(f"--impl {name!r} is not registered: use one of {', '.join(REGISTRY)}")
    usable = available_backends(device)
    chosen = list(backends) if backends else ["auto"]
    for b in chosen:
        if b != "auto" and b not in usable:
            raise ValueError(f"backend {b!r} cannot run on {device}: use one of auto, {', '.join(usable)}")
    gen = torch.Generator().manual_seed(seed)
    results, skipped = [], []
    dist_names = [n for n in names if REGISTRY[n].distributed and distributed_run]
    names = [n for n in names if n not in dist_names]
    chosen_cases = cases if cases is not None else case_matrix(full)
    for name in dist_names:
        for world in world_sizes:
            for result in _verify_distributed(name, world, chosen_cases, semantics, causal, chosen, torch_dtype, seed,
                                              dist_timeout_s, skipped, patterns):
                results.append(result)
                if on_result:
                    on_result(result)
    for name in names:
        impl = REGISTRY[name]
        runner = _run_multihead if impl.kind == "multihead" else _run_core
        for variant in _variants(chosen_cases, semantics, causal, chosen, _patterns(impl, patterns)):
            result = _check_one(impl, runner, *variant, torch_dtype, device, gen)
            results.append(result)
            if on_result:
                on_result(result)
    return VerifyReport(results=results, passed=all(r.passed for r in results), seed=seed, skipped=skipped)


def _check_one(impl, runner, case, sem, is_causal, backend, uncovered, pattern, dtype, device, gen) -> CaseResult:
    common = dict(impl=impl.name, dtype=str(dtype).split(".")[-1], device=device,
                  **_case_fields(case, sem, is_causal, backend, uncovered, pattern))
    try:
        got, reference = runner(impl, case, sem, is_causal, backend, dtype, device, gen, pattern)
        ref = reference(torch.float64, torch.float64)
        naive = reference(dtype, dtype) if dtype in HALF else {}
        errors = {k: _compare(k, got[k], ref[k], naive.get(k), dtype) for k in got}
    except Exception as exc:  # a crashing implementation is a failed case, reported, not a crashed run
        return CaseResult(**common, errors={}, passed=False, message=f"{type(exc).__name__}: {exc}")
    return CaseResult(**common, errors=errors, passed=all(e.passed for e in errors.values()))


def _verify_distributed(name, world, cases, semantics, causal, backends, dtype, seed, timeout_s, skipped, patterns) -> list[CaseResult]:
    """One process group per (implementation, world size) runs every shardable case."""
    from ..runtime.launch import run_distributed
    from .distributed import case_inputs, combine, multihead_inputs, rank_outputs, run_multihead
    from .distributed import shard_problem

    shardable = []
    for case in cases:
        problem = shard_problem(case, world, name)
        if problem:
            skipped.append(f"{name} p={world}, case '{case.name}': {problem}")
        else:
            shardable.append(case)
    jobs, meta = [], []
    for case, sem, is_causal, backend, uncovered, pattern in _variants(shardable, semantics, causal, backends,
                                                                       _patterns(REGISTRY[name], patterns)):
        job_seed = seed * 1000 + len(jobs)
        jobs.append((case.model_dump(), sem, is_causal, backend, job_seed, pattern))
        meta.append((case, sem, is_causal, backend, job_seed, uncovered, pattern))
    if not jobs:
        return []
    dtype_name = str(dtype).split(".")[-1]
    common = dict(impl=name, world_size=world, dtype=dtype_name, device="cpu")
    try:
        per_rank = run_distributed(rank_outputs, world, name, jobs, dtype_name, timeout_s=timeout_s)
    except Exception as exc:  # the whole group failed: every case of it is a failure, reported
        return [CaseResult(**common, **_case_fields(c, s, k, b, u, pt), errors={}, passed=False, message=str(exc))
                for c, s, k, b, _, u, pt in meta]
    multihead = REGISTRY[name].kind == "multihead"
    results = []
    for j, (case, sem, is_causal, backend, job_seed, uncovered, pattern) in enumerate(meta):

        def reference(compute_dtype, src_dtype):
            if multihead:
                module = build_multihead(name, case, sem, backend, job_seed, pattern)
                module.attention = _ReferenceAttention(module.attention, compute_dtype)
                x, upstream = multihead_inputs(case, job_seed)
                return run_multihead(module.to(src_dtype), x.to(src_dtype), upstream, is_causal)
            base = case_inputs(case, job_seed)
            xs = [x.to(src_dtype).requires_grad_() for x in base[:3]]
            o, l = build_core(name, case, sem, backend, pattern).reference(*xs, is_causal, compute_dtype=compute_dtype)
            return {"out": o, "lse": l, **dict(zip(("dq", "dk", "dv"), _grads(o, xs, base[3])))}

        got = combine(name, per_rank, j)
        ref = reference(torch.float64, torch.float64)
        naive = reference(dtype, dtype) if dtype in HALF else {}
        errors = {k: _compare(k, got[k], ref[k], naive.get(k), dtype) for k in got}
        results.append(CaseResult(**common, **_case_fields(case, sem, is_causal, backend, uncovered, pattern), errors=errors,
                                  passed=all(e.passed for e in errors.values()),
                                  comm=[r[j]["comm"] for r in per_rank]))
    return results


def _patterns(impl: Implementation, patterns: list[str]) -> list[str | None]:
    return patterns if impl.block_sparse else [None]


def _variants(cases, semantics, causal, backends, patterns=(None,)):
    """(case, semantics, causal, backend, uncovered fraction, pattern) for every combination that is
    legal and distinct: head_groups needs at least one head per pair; of the block patterns only
    'longnet' depends on the semantics."""
    for case in cases:
        for sem in semantics:
            if sem == "head_groups" and case.heads < len(case.segment_lengths):
                continue
            for pattern in patterns:
                if pattern is not None and pattern != "longnet" and sem != semantics[0]:
                    continue
                if pattern is None:
                    uncovered = uncovered_fraction(case.seq_len, case.heads, case.segment_lengths, case.dilation_rates, sem)
                else:
                    uncovered = _uncovered_blocks(case, sem, pattern)
                for is_causal in causal:
                    for backend in backends:
                        yield case, sem, is_causal, backend, uncovered, pattern


def _uncovered_blocks(case: VerifyCase, sem: str, pattern: str) -> float:
    """Share of query rows whose block attends no key block (they output 0)."""
    module = build_core("BlockSparseRingDilatedAttention", case, sem, "auto", pattern)
    table = module.block_table(case.seq_len, case.heads)
    rows = torch.full((table.shape[0],), module.block_size)
    rows[-1] = case.seq_len - module.block_size * (table.shape[0] - 1)
    return rows[~table.any(dim=1)].sum().item() / case.seq_len


def _case_fields(case: VerifyCase, sem: str, is_causal: bool, backend: str, uncovered: float, pattern: str | None) -> dict:
    return dict(
        case=case.name, backend=backend, semantics=sem, causal=is_causal, batch=case.batch, seq_len=case.seq_len,
        heads=case.heads, head_dim=case.head_dim, segment_lengths=case.segment_lengths,
        dilation_rates=case.dilation_rates, uncovered_fraction=uncovered, pattern=pattern,
    )
