"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..kernels.backends import available_backends
from ..kernels.block_sparse.patterns import PATTERNS
from ..kernels.registry import REGISTRY, names
from .cases import Case, case_matrix
from .compare import DTYPES
from .distributed import verify_distributed
from .report import CaseResult, VerifyReport
from .single import check_one
from .variants import Grid


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
    cases: list[Case] | None = None,
    patterns: Iterable[str] = PATTERNS,
    on_result: Callable[[CaseResult], None] | None = None,
) -> VerifyReport:
    """Check each implementation x case x semantics x causal x backend (x block pattern) against the
    reference; distributed implementations with world_sizes other than [1] run in process groups."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown: use one of {', '.join(DTYPES)}")
    worlds = sorted(set(world_sizes))
    if any(w < 1 for w in worlds):
        raise ValueError(f"--world-size values must be >= 1, got {worlds}")
    distributed_run = worlds != [1]
    chosen = _implementations(impls, distributed_run)
    grid = _grid(dtype, semantics, causal, backends, device, patterns)
    _check_implementations(chosen)
    _check_backends(grid.backends, device)
    gen = torch.Generator().manual_seed(seed)
    checked = cases if cases is not None else case_matrix(full)
    results: list[CaseResult] = []
    skipped: list[str] = []

    def record(result: CaseResult) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    sharded = [n for n in chosen if distributed_run and REGISTRY[n].distributed]
    for name in sharded:
        for world in worlds:
            for result in verify_distributed(name, world, checked, grid, seed, dist_timeout_s, skipped):
                record(result)
    for name in (n for n in chosen if n not in sharded):
        for variant in grid.variants(checked, name):
            record(check_one(variant, gen))
    return VerifyReport(results=results, passed=all(r.passed for r in results), seed=seed, skipped=skipped)


def _implementations(impls: Iterable[str] | None, distributed_run: bool) -> list[str]:
    """The requested names, or every registered non-baseline entry that runs single-device (distributed,
    when world sizes other than 1 are asked for)."""
    if impls:
        return list(impls)
    return names(lambda s: not s.baseline and (s.distributed if distributed_run else s.single_device))


def _grid(dtype: str, semantics: Iterable[str], causal: Iterable[bool], backends: Iterable[str] | None, device: str,
          patterns: Iterable[str]) -> Grid:
    patterns = list(patterns)
    for pattern in patterns:
        if pattern not in PATTERNS:
            raise ValueError(f"--pattern {pattern!r} is unknown: use one of {', '.join(PATTERNS)}")
    return Grid(semantics=list(semantics), causal=list(causal), backends=list(backends) if backends else ["auto"],
                patterns=patterns, dtype=dtype, device=device)


def _check_implementations(chosen: list[str]) -> None:
    for name in chosen:
        if name not in REGISTRY:
            raise ValueError(f"--impl {name!r} is not registered: use one of {', '.join(REGISTRY)}")


def _check_backends(backends: list[str], device: str) -> None:
    usable = available_backends(device)
    for b in backends:
        if b != "auto" and b not in usable:
            raise ValueError(f"backend {b!r} cannot run on {device}: use one of auto, {', '.join(usable)}")
