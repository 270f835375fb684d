"""The checks of a run, collected before any runs (so a progress display knows the total), with what was
skipped and why: an implementation that cannot run on the device, a semantics a case cannot take, a case
an implementation refuses, a case a world size cannot shard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..kernels.registry import REGISTRY
from .cases import Case, for_impl
from .variants import Grid, Variant


@dataclass
class Checks:
    """Everything a run will check: process groups first (in this order), then single-process checks."""

    groups: list[tuple[str, int, list[Variant]]]  # (distributed implementation, world size, its checks)
    single: list[Variant]
    skipped: list[str]
    grid: Grid
    seed: int
    dist_timeout_s: float
    attached: Any = None  # runtime.attach.World: the groups run in the launcher's world, not spawned here

    @property
    def total(self) -> int:
        return len(self.single) + sum(len(checks) for _, _, checks in self.groups)


def unavailable_here(impl: str, device: str) -> str | None:
    """Why `impl` cannot run on `device` here (with the fix), or None."""
    return REGISTRY[impl].unavailable(device)


def semantics_skips(cases: list[Case], semantics: list[str]) -> list[str]:
    """head_groups needs at least one head per pair: a case with fewer heads is checked without it."""
    if "head_groups" not in semantics:
        return []
    return [
        f"case '{c.name}', head_groups: {c.problem.heads} heads < {len(c.problem.segment_lengths)} pairs "
        "(head_groups needs --heads >= the number of segments)"
        for c in cases
        if c.problem.heads < len(c.problem.segment_lengths)
    ]


def impl_checks(impl: str, cases: list[Case], grid: Grid, skipped: list[str], world_size: int = 1) -> list[Variant]:
    """`impl`'s checks of every case; a case the implementation refuses goes to `skipped`, with the reason."""
    label = impl if world_size == 1 else f"{impl} p={world_size}"
    checks: list[Variant] = []
    for case in cases:
        try:
            checks.extend(list(grid.variants([case], impl, world_size=world_size)))
        except ValueError as exc:
            skipped.append(f"{label}, case '{case.name}': {exc}")
    return checks


def shardable(impl: str, world: int, cases: list[Case], skipped: list[str]) -> list[Case]:
    """The cases the registry's shard rule lets `world` ranks split for `impl`; the others, with the
    reason, go to `skipped`."""
    kept = []
    for case in cases:
        try:
            problem = for_impl(case.problem, impl)
        except ValueError as exc:
            skipped.append(f"{impl} p={world}, case '{case.name}': {exc}")
            continue
        reason = problem.spec.shard_rule(problem, world)
        if reason:
            skipped.append(f"{impl} p={world}, case '{case.name}': {reason.removeprefix(impl + ': ')}")
        else:
            kept.append(case)
    return kept


def group_checks(impl: str, world: int, cases: list[Case], grid: Grid, skipped: list[str]) -> list[Variant]:
    """The checks one process group of `world` ranks runs for `impl`, on the grid's device (a GPU per rank)."""
    return impl_checks(impl, shardable(impl, world, cases, skipped), grid, skipped, world_size=world)
