"""The checks of a run: every case along the axes the caller chose (semantics, block pattern, causal,
backend), each one a Problem ready to build, with the share of rows its pattern leaves uncovered."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..kernels.block_sparse.patterns import takes
from ..kernels.pattern import uncovered_fraction
from ..kernels.registry import REGISTRY
from ..workload.problem import Problem
from .cases import Case, for_impl


@dataclass(frozen=True)
class Variant:
    """One check: a case's problem with implementation, semantics, block pattern, causal and backend set."""

    case: str
    problem: Problem
    uncovered: float  # share of rows that attend nothing (they output 0)

    @property
    def pattern(self) -> str | None:
        return self.problem.pattern if self.problem.spec.block_sparse else None


@dataclass(frozen=True)
class Grid:
    """The axes every case is checked along, and the dtype and device of the checks."""

    semantics: list[str]
    causal: list[bool]
    backends: list[str]
    patterns: list[str]
    dtype: str
    device: str
    token_window: tuple[int, int] | None = None  # sliding_window checks: (left, right) tokens; None: the default
    block_size: int | None = None  # of the block-sparse checks; None: each case's own
    layout: str = "contiguous"  # shard layout of process-group checks, where the implementation takes it

    def variants(self, cases: list[Case], impl: str, world_size: int = 1) -> Iterator[Variant]:
        """Every combination that is legal and distinct: head_groups needs at least one head per pair;
        of the block patterns only those that take it (patterns.py: 'longnet') depend on the semantics."""
        patterns = self.patterns if REGISTRY[impl].block_sparse else [None]
        for case in cases:
            for sem in self.semantics:
                if sem == "head_groups" and case.problem.heads < len(case.problem.segment_lengths):
                    continue
                for pattern in patterns:
                    if pattern is not None and not takes(pattern, "semantics") and sem != self.semantics[0]:
                        continue
                    base = for_impl(
                        case.problem,
                        impl,
                        pattern or "dilated",
                        self.token_window,
                        self.block_size,
                        semantics=sem,
                        dtype=self.dtype,
                        device=self.device,
                        world_size=world_size,
                        mode="fwdbwd",
                    )
                    if world_size > 1 and base.layout_refusal(self.layout) is None:
                        base = base.with_(layout=self.layout)
                    uncovered = uncovered_share(base)
                    for is_causal in self.causal:
                        for backend in self.backends:
                            yield Variant(case.name, base.with_(causal=is_causal, backend=backend), uncovered)


def uncovered_share(p: Problem) -> float:
    """Share of query rows (position, head) that attend no key: no pair keeps them, or (block-sparse)
    their block attends no key block."""
    if not p.spec.block_sparse:
        return uncovered_fraction(p.seq_len, p.heads, p.segment_lengths, p.dilation_rates, p.semantics)
    table = p.block_pattern().table(p.seq_len, p.heads)
    rows = torch.full((table.shape[0],), p.block_size)
    rows[-1] = p.seq_len - p.block_size * (table.shape[0] - 1)
    return rows[~table.any(dim=1)].sum().item() / p.seq_len
