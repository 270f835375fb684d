"""--interleave: the lines (implementations, densities) of one N measured in one worker, their timed calls taken
round-robin (A, B, A, B, ...) so that load coming and going hits every line alike. The ratio between lines is
then the figure a noisy machine can still give; every row records the CPU other processes took meanwhile.

Memory on CPU: each line's peak RSS of one call above the worker's RSS before that line was built (freed
memory returned to the OS, as for an isolated point), so the lines measured before it are left out; the
row's mem_method says so. A line that fails (OOM, error, over --max-seconds) gets its own row and the
others go on; the time budget is --max-seconds per line.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from ..runtime.limits import address_space_capped, cap_address_space
from ..runtime.measure import return_freed_memory, reuse_freed_memory, rss_bytes
from ..workload.problem import Problem
from .config import Sweep
from .point import TIMING_HEADROOM, ColdCache, _stepper, first_call, peak_of_one_call, timing_fields
from .probes import Probes
from .sampling import Clock, take_samples, warm_up

MEM_METHOD = (
    "peak RSS of one call after the first, freed memory returned to the OS, above the interleaved worker's "
    "RSS before this line was built (the lines built before it left out), inputs included"
)


class LineFailed(Exception):
    def __init__(self, index: int, error: BaseException):
        super().__init__(str(error))
        self.index, self.error = index, error


class _Line:
    def __init__(self, index: int, problem: Problem):
        self.index, self.problem = index, problem
        self.step: Callable[[], float] | None = None
        self.module: Any = None
        self.memory: dict = {}

    def guarded(self) -> Callable[[], float]:
        def step() -> float:
            try:
                return self.step()
            except Exception as exc:  # this line fails; the others are timed again without it
                raise LineFailed(self.index, exc) from exc

        return step


def _prepare(sweep: Sweep, line: _Line, returns_memory: bool, cold: ColdCache) -> dict | None:
    """Build the line, make its first call (the time projection) and its memory call; a skip result or None."""
    import torch

    if returns_memory:  # the baseline without the garbage an earlier line left: the trim below would drop it
        gc.collect()
        return_freed_memory()
    before = rss_bytes()
    torch.manual_seed(sweep.seed)
    line.step, line.module, _ = _stepper(sweep, line.problem, None, cold)
    _, _, skipped = first_call(sweep, line.step)  # this line's projection, as if alone
    if skipped:
        return skipped
    if sweep.cuda:
        return None
    peak, exact = peak_of_one_call(line.step, before, returns_memory)
    method = (
        MEM_METHOD
        if exact
        else "peak RSS of the interleaved worker (all lines) above its RSS before this line was built"
    )
    line.memory = {"peak_mem_bytes": peak, "mem_method": method}
    return None


def measure_group(sweep: Sweep, problems: list[Problem]) -> list[dict | BaseException]:
    """Every problem's row fields, or the exception that ended it (the worker turns it into a failure row)."""
    returns_memory = not sweep.cuda and return_freed_memory()
    lines = [_Line(i, p) for i, p in enumerate(problems)]
    results: list[dict | BaseException | None] = [None] * len(lines)
    cold = ColdCache(sweep)  # one flush buffer for every line, made after their memory calls
    for line in lines:
        try:
            results[line.index] = _prepare(sweep, line, returns_memory, cold)
        except Exception as exc:
            results[line.index] = exc
    active = [line for line in lines if results[line.index] is None]
    if returns_memory and reuse_freed_memory() and address_space_capped():
        cap_address_space(sweep.max_memory, TIMING_HEADROOM)
    clock = Clock(sweep.max_seconds * len(active))
    cold.start()
    while active:
        try:
            timed = _time_round_robin(sweep, active, clock, cold.nbytes)
        except LineFailed as failed:
            results[failed.index] = failed.error
            active = [line for line in active if line.index != failed.index]
            continue
        for line, fields in zip(active, timed):
            results[line.index] = fields
        break
    return results


def _time_round_robin(sweep: Sweep, lines: list[_Line], clock: Clock, flush_bytes: int) -> list[dict]:
    import torch

    steps = [line.guarded() for line in lines]
    if not sweep.cuda:
        for step in steps:
            step()  # untimed: the heap grows to its steady state under the timing setting
    probes = Probes(sweep)
    probes.start()
    warmup_calls, warm = warm_up(steps, sweep.warmup, clock)
    samples, stopped_by = take_samples(steps, sweep.repeat, sweep.precision, clock)
    probed = probes.fields()
    rows = []
    for line, times in zip(lines, samples):
        fields = timing_fields(line.problem, times, sweep, stopped_by, dict(probed))
        fields.update(warmup_calls=warmup_calls, warmup_settled=warm, interleaved=True, **line.memory)
        if line.problem.target != "attention":
            fields["params"] = sum(p.numel() for p in line.module.parameters())
        if sweep.cuda:
            fields.update(
                peak_mem_bytes=torch.cuda.max_memory_allocated() - flush_bytes,
                mem_method="torch.cuda.max_memory_allocated over all interleaved lines (allocator view)",
            )
        rows.append(fields)
    return rows
