"""`dattn profile`: one problem with the pattern cache and memory pool on, then off (its options: cli/build.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .attach import refuse_launcher
from .build import generated, model_values
from .render.common import emit, emit_csv, machine_output, note, progress, set_quiet, stdout
from .render.profile import pattern_title, profile_table, setting_line


def _refuse_block_options(impl: str, given: dict[str, object]) -> None:
    """Pattern options on an implementation that takes none: one line naming them and the fix."""
    from ..kernels.registry import REGISTRY, names

    spec = REGISTRY.get(impl)
    used = [option for option, value in given.items() if value is not None]
    if spec is not None and not spec.block_sparse and used:
        raise ValueError(
            f"{', '.join(used)}: block-sparse implementations only; use --impl "
            f"{' or '.join(names(lambda s: s.block_sparse))}"
        )


def _show_pattern(report, path: Path) -> None:
    from ..bench.plot import plot_block_table
    from ..profile import block_table_for

    problem = report.config.problem
    table = block_table_for(problem)
    plot_block_table(table, path, pattern_title(report), problem.causal)
    note(f"block mask ({table.shape[0]} x {table.shape[1]} blocks) written to {path}")


def _show(report, o: SimpleNamespace) -> None:
    stdout.print(profile_table(report))
    if o.show_pattern is not None:
        _show_pattern(report, o.show_pattern)
    for line in report.notes:
        note(f"note: {line}", style="yellow")
    if o.json_out:
        emit(o.json_out, report.model_dump_json(indent=1))
    if o.csv_out:  # one line per setting, the problem's fields repeated on each
        problem = report.config.problem.model_dump()
        emit_csv(o.csv_out, [{"problem": problem, **s.model_dump()} for s in (report.caches_on, report.caches_off)])


@generated("profile")
def profile(**given: Any) -> None:
    """Pattern-cache and memory-pool hit rates, allocator stats, time and peak memory with caches on vs off."""
    o = SimpleNamespace(**given)
    refuse_launcher("profile", None)
    machine_output(o.json_out, o.csv_out)
    set_quiet(o.quiet)
    from ..profile import run_profile
    from ..workload import Problem

    _refuse_block_options(
        o.impl, {"--pattern": o.pattern, "--window": o.window, "--density": o.density, "--show-pattern": o.show_pattern}
    )
    problem = Problem(**model_values("profile", given, Problem))
    with progress() as bar:
        task = bar.add_task(f"profile {o.impl}", total=2)
        report = run_profile(problem, iterations=o.iterations, warmup=o.warmup, seed=o.seed, trace=o.trace)
        for setting in (report.caches_on, report.caches_off):  # run_profile reports both settings at its end
            bar.update(task, advance=1, description=setting_line(report, setting))
    _show(report, o)
