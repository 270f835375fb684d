"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..kernels.backends import available_backends
from ..kernels.block_sparse.patterns import PATTERNS
from ..kernels.distributed.layout import check_layout
from ..kernels.registry import REGISTRY, names
from ..runtime.limits import available_memory_bytes, check_spawned_ranks
from ..workload.check_memory import check_items, group_peak
from ..workload.parse import MAX_SECONDS, MAX_SEED, check_count, check_number, shown
from ..workload.problem import SIZE_LIMITS, ZIGZAG_STRATEGIES
from .cases import Case, case_matrix
from .checks import Checks, group_checks, impl_checks, semantics_skips, unavailable_here
from .compare import DTYPES
from .distributed import verify_group
from .growth import error_growth
from .references import ReferenceCache, chunk_elements, reference_key, uses_local_reference
from .report import CaseResult, VerifyReport
from .single import check_one
from .variants import Grid, Variant

ImplMemory = Callable[[Any], "int | None"]


def run_verify(
    impls: Iterable[str] | None = None, *, on_result: Callable[[CaseResult], None] | None = None, **options: Any
) -> VerifyReport:
    """Check each implementation x case x semantics x causal x backend (x block pattern) against the
    reference; distributed implementations with world_sizes other than [1] run in process groups.
    `options` are collect_checks's."""
    return run_checks(collect_checks(impls, **options), on_result)


def collect_checks(
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
    token_window: tuple[int, int] | None = None,
    block_size: int | None = None,
    attached: Any = None,
    impl_memory: ImplMemory | None = None,
    layout: str = "contiguous",
) -> Checks:
    """Every check of a run, and what is skipped with the reason. Default implementations that cannot run
    here are skipped; requested ones are refused (ValueError), as is a run left with nothing to check or one
    whose largest check does not fit in memory. `impl_memory(problem)`: an implementation's peak bytes (the CLI
    passes the planner's model; None or 0: a stated multiple of the input size)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown: use one of {', '.join(DTYPES)}")
    worlds = sorted(set(world_sizes))
    if not worlds or any(w < 1 for w in worlds):
        raise ValueError(f"--world-size values must be >= 1, got {worlds or 'none'}: e.g. --world-size 1,2")
    if attached is None:
        check_spawned_ranks(worlds[-1], device=device)
    elif worlds != [attached.world_size]:
        raise ValueError(
            f"--world-size {','.join(map(str, worlds))}: attached to a world of {attached.world_size} "
            f"ranks ({attached.launcher}), which is the one size checked: drop --world-size or pass "
            f"{attached.world_size}"
        )
    check_number("--dist-timeout", dist_timeout_s, 0, MAX_SECONDS, low_open=True)
    check_count("--seed", seed, 0, MAX_SEED)
    if block_size is not None:
        check_count("--block-size", block_size, 1, SIZE_LIMITS["block_size"])
    distributed_run = worlds != [1]
    requested = list(impls or [])
    grid = _grid(dtype, semantics, causal, backends, device, patterns, token_window, block_size, layout)
    _check_implementations(requested)
    _check_backends(grid.backends, device)
    checked = cases if cases is not None else case_matrix(full)
    _check_case_memory(checked, device)
    skipped = semantics_skips(checked, grid.semantics)
    _check_layout_takers(layout, requested)
    chosen = _runnable(_implementations(requested, distributed_run), bool(requested), distributed_run, device, skipped)
    sharded = [n for n in chosen if distributed_run and REGISTRY[n].distributed]
    groups = [(name, world, group_checks(name, world, checked, grid, skipped)) for name in sharded for world in worlds]
    single = [v for name in chosen if name not in sharded for v in impl_checks(name, checked, grid, skipped)]
    checks = Checks([g for g in groups if g[2]], single, skipped, grid, seed, dist_timeout_s, attached)
    if not checks.total:
        raise ValueError("nothing to check: " + "; ".join(skipped or ["no implementation was chosen"]))
    _check_memory(checks, device, impl_memory)
    return checks


def run_checks(checks: Checks, on_result: Callable[[CaseResult], None] | None = None) -> VerifyReport:
    """Run the collected checks: process groups first, then single-process checks; the checks that share a
    reference run one after another (groups by their first check's), so it is computed once
    (references.ReferenceCache keeps the last one whatever its size). The report lists them in the order
    they were collected."""
    cache = ReferenceCache(checks.seed)
    done: list[tuple[int, CaseResult]] = []

    def record(index: int, result: CaseResult) -> None:
        done.append((index, result))
        if on_result:
            on_result(result)

    starts = list(itertools.accumulate((len(group) for _, _, group in checks.groups), initial=0))
    for j in by_reference([group[0] for _, _, group in checks.groups], checks.seed):  # groups sharing one together
        name, world, group = checks.groups[j]
        order = by_reference(group, checks.seed)
        results = verify_group(name, world, [group[i] for i in order], cache, checks.dist_timeout_s, checks.attached)
        for i, result in zip(order, results):
            record(starts[j] + i, result)
    start = starts[-1]
    for i in by_reference(checks.single, checks.seed):
        record(start + i, check_one(checks.single[i], cache))
    if not done:  # a verify that checked nothing must not pass
        raise ValueError("verify ran no check: " + "; ".join(checks.skipped or ["nothing was collected"]))
    results = [result for _, result in sorted(done, key=lambda item: item[0])]
    return VerifyReport(
        results=results,
        passed=all(r.passed for r in results),
        seed=checks.seed,
        skipped=checks.skipped,
        growth=error_growth(results),
    )


def by_reference(variants: list[Variant], seed: int) -> list[int]:
    """Indices of `variants`, those of one reference together (in the order their references first appear)."""
    first: dict[tuple, int] = {}
    keys = [first.setdefault(reference_key(v.case, v.problem, seed), len(first)) for v in variants]
    return sorted(range(len(variants)), key=lambda i: keys[i])


def _runnable(chosen: list[str], requested: bool, distributed_run: bool, device: str, skipped: list[str]) -> list[str]:
    """`chosen` without the implementations that cannot run here: requested ones are refused, defaults skipped."""
    runnable = []
    for name in chosen:
        reason = unavailable_here(name, device)
        if reason and requested:
            raise ValueError(f"--impl {name} cannot run here: {reason}")
        if REGISTRY[name].baseline:  # dense attention computes another function than the dilated reference
            raise ValueError(
                f"--impl {name} is a baseline, not a dilated attention: verify checks "
                f"{', '.join(names(lambda s: not s.baseline))}"
            )
        if reason:
            skipped.append(f"{name}: {reason}")
        else:
            runnable.append(name)
    return runnable


def _implementations(impls: list[str], distributed_run: bool) -> list[str]:
    """The requested names, or every registered non-baseline entry that runs single-device (distributed,
    when world sizes other than 1 are asked for)."""
    if impls:
        return impls
    return names(lambda s: not s.baseline and (s.distributed if distributed_run else s.single_device))


def _grid(
    dtype: str,
    semantics: Iterable[str],
    causal: Iterable[bool],
    backends: Iterable[str] | None,
    device: str,
    patterns: Iterable[str],
    token_window: tuple[int, int] | None = None,
    block_size: int | None = None,
    layout: str = "contiguous",
) -> Grid:
    patterns = list(patterns)
    if unknown := [pattern for pattern in patterns if pattern not in PATTERNS]:
        raise ValueError(f"--pattern {unknown[0]!r} is unknown: use one of {', '.join(PATTERNS)}")
    return Grid(
        semantics=list(semantics),
        causal=list(causal),
        backends=list(backends) if backends else ["auto"],
        patterns=patterns,
        dtype=dtype,
        device=device,
        token_window=token_window,
        block_size=block_size,
        layout=check_layout(layout, "--layout"),
    )


def _check_layout_takers(layout: str, requested: list[str]) -> None:
    """Requested implementations none of which takes the layout: refused (the case matrix's other checks,
    such as packed documents, stay contiguous where the implementation does take it)."""
    if layout != "contiguous" and requested and not any(REGISTRY[n].strategy in ZIGZAG_STRATEGIES for n in requested):
        takers = names(lambda s: s.strategy in ZIGZAG_STRATEGIES)
        raise ValueError(
            f"--layout {layout}: {', '.join(requested)} take contiguous shards only; use one of {', '.join(takers)}, "
            "or --layout contiguous"
        )


def _check_implementations(chosen: list[str]) -> None:
    for name in chosen:
        if name not in REGISTRY:
            raise ValueError(f"--impl {shown(name)} is not registered: use one of {', '.join(REGISTRY)}")


def check_need(v: Variant, world: int = 1, checks: int = 1, impl_memory: ImplMemory | None = None) -> int:
    """Peak bytes of check `v` (workload/check_memory.py): one process, or a group of `world` ranks running
    `checks` checks; the implementation's part from `impl_memory` (the planner's model) where it has one."""
    p = v.problem
    impl = (impl_memory(p) if impl_memory is not None else None) or None  # None or 0: the planner has no figure
    local, chunk = uses_local_reference(p), chunk_elements(p.device)
    if world > 1:
        return group_peak(p, world, checks, local, chunk, impl)
    return check_items(p, local, chunk, impl)[1]


def available_on(device: str) -> tuple[int | None, str]:
    """Bytes a check can use on `device` now, and where that figure comes from."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free, f"free on {device}"
    return available_memory_bytes(), "available here (MemAvailable)"


def _check_memory(checks: Checks, device: str, impl_memory: ImplMemory | None) -> None:
    """Refuse, before anything runs, a run whose largest check does not fit in this device's memory: one line
    naming the need, what is available and the way out (never an allocation failure or the OOM killer)."""
    available, where = available_on(device)
    if available is None:
        return
    needs = [(check_need(v, impl_memory=impl_memory), v) for v in checks.single]
    needs += [(check_need(v, w, len(g), impl_memory), v) for _, w, g in checks.groups for v in g]
    need, worst = max(needs, key=lambda item: item[0])
    if need > available:
        fit = sorted({v.problem.impl for n, v in needs if n <= available})
        _refuse(worst.problem, need, available, where, f"--impl {' --impl '.join(fit)} (those fit), or " if fit else "")


def _check_case_memory(cases: list[Case], device: str) -> None:
    """The same refusal before the checks are built (building one allocates per position): each case's reference
    alone, without the implementation."""
    available, where = available_on(device)
    for case in cases if available is not None else []:
        p = case.problem.with_(mode="fwdbwd", device=device)
        need = check_items(p, uses_local_reference(p), chunk_elements(device), impl_bytes=0)[1]
        if need > available:
            _refuse(p, need, available, where, "")


def _refuse(p, need: int, available: int, where: str, way: str) -> None:
    raise ValueError(
        f"verify needs about {need / 2**30:,.1f} GiB for {p.impl}{f' p={p.world_size}' if p.world_size > 1 else ''}"
        f" at B={p.batch} N={p.seq_len:,} H={p.heads} D={p.head_dim} {p.dtype} (a float64 reference with "
        f"gradients beside the implementation), more than the {available / 2**30:,.1f} GiB {where}: check "
        f"{way}a smaller --seq-len, --heads or --batch"
    )


def _check_backends(backends: list[str], device: str) -> None:
    usable = available_backends(device)
    for b in backends:
        if b != "auto" and b not in usable:
            raise ValueError(f"backend {b!r} cannot run on {device}: use one of auto, {', '.join(usable)}")
