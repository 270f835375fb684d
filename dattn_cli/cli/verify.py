"""`dattn verify`: every implementation against the dense reference, forward and gradients."""

from __future__ import annotations

import sys

import typer

from .options import (BackendsOption, BothOption, CausalFilterOption, DetailsOption, DeviceOption, DistTimeoutOption,
                      DTypeOption, FullOption, ImplsOption, JsonOption, PatternsOption, SeedOption, SemanticsSetOption,
                      WorldSizeOption)
from .render.common import machine_output, emit, note, progress, stdout
from .render.verify import verify_summary, verify_table, verify_warnings


def verify(
    impl: ImplsOption = None, backend: BackendsOption = None, device: DeviceOption = "cpu",
    dtype: DTypeOption = "float32",
    semantics: SemanticsSetOption = "both", causal: CausalFilterOption = None, both: BothOption = False,
    pattern: PatternsOption = None,
    full: FullOption = False, seed: SeedOption = 0,
    world_size: WorldSizeOption = "1", dist_timeout: DistTimeoutOption = 120.0,
    json_out: JsonOption = None, details: DetailsOption = False,
) -> None:
    """Equivalence of every implementation against the dense reference, forward and gradients.

    Default --impl: every single-device implementation, or every distributed one with --world-size > 1.
    """
    machine_output(json_out)
    from ..runtime.envinfo import collect_environment
    from ..verify import case_matrix, run_verify
    from ..workload import parse_int_list

    if both and causal is not None:
        raise ValueError("--both conflicts with --causal/--no-causal: give one of them")
    options = dict(
        world_sizes=parse_int_list(world_size, "--world-size"), dist_timeout_s=dist_timeout, full=full, dtype=dtype,
        semantics=["longnet", "head_groups"] if semantics == "both" else [semantics],
        causal=[False, True] if causal is None else [causal], backends=backend, device=device, seed=seed,
        cases=case_matrix(full), **({"patterns": pattern} if pattern else {}),
    )
    with progress() as bar:
        task = bar.add_task("verify", total=None)
        report = run_verify(impl, on_result=lambda r: bar.advance(task), **options)
    stdout.print(verify_table(report, details))
    for line in verify_warnings(report, details):
        note(f"[yellow]{line}[/]")
    stdout.print(verify_summary(report))
    if json_out is not None:
        report.environment = {**collect_environment().model_dump(), "command": ["dattn", *sys.argv[1:]]}
        emit(json_out, report.model_dump_json(indent=1))
    if not report.passed:
        raise typer.Exit(code=1)
