"""`dattn verify`: every implementation against the dense reference, forward and gradients, on the built-in
case matrix or on the user's own configuration (any shape or pattern option given)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import typer

from .attach import agreed_exit_code, joined
from .build import generated, model_values, options_of, parameters, parse_option
from .render.common import emit, emit_csv, machine_output, note, progress, set_quiet, stdout
from .render.verify import check_line, verify_summary, verify_table, verify_warnings

# verify's Problem options that set what each check varies; every other one given is your configuration
AXES = (
    *("impl", "backend", "device", "dtype", "semantics", "causal", "pattern", "window_left", "window_right"),
    *("block_size", "world_size", "layout"),
)
OUTPUTS = ("json_out", "csv_out", "junit", "markdown", "plot")  # rank 0's alone when attached


def _cases(full: bool, given: dict[str, Any]) -> tuple[list, bool]:
    """(the cases to check, whether they are the user's own configuration): the case matrix, or one case of
    the Problem options given (a value other than the option's default)."""
    from ..verify import case_matrix, own_cases
    from ..workload import Problem

    options, defaults = options_of("verify"), {p.name: p.default for p in parameters("verify")}
    own = {
        name: given[name]
        for name in options
        if name in Problem.model_fields and name not in AXES and given[name] != defaults[name]
    }
    if not own:
        return case_matrix(full), False
    if full:
        named = ", ".join(options[name][1].option(options[name][0]) for name in own)
        raise ValueError(f"--full checks the built-in case matrix; drop it to check your configuration ({named})")
    values = model_values("verify", own, Problem)
    seq_lens, documents = values.pop("seq_len", None), values.get("documents")
    return own_cases(seq_lens or ([sum(documents)] if documents else None), **values), True


def _axes(own: bool, semantics: str | None, causal: bool | None, both: bool) -> dict[str, list]:
    """Semantics and causal flags to check: as given; else both ways on the case matrix, and your configuration
    as the other commands default it (longnet, non-causal)."""
    if both and causal is not None:
        raise ValueError("--both conflicts with --causal/--no-causal: give one of them")
    semantics = semantics or ("longnet" if own else "both")
    return dict(
        semantics=["longnet", "head_groups"] if semantics == "both" else [semantics],
        causal=[causal] if causal is not None else [False] if own and not both else [False, True],
    )


def _note_slow_reference(cases: list, device: str) -> None:
    from ..verify import SLOW_REFERENCE_SCORES, reference_scores

    scores = max(reference_scores(case) for case in cases)
    if scores > SLOW_REFERENCE_SCORES and not device.startswith("cuda"):
        note(
            f"note: each reference computes {scores:.1e} float64 scores, with gradients: expect a minute or more "
            "per reference on a CPU (--impl checks fewer implementations)"
        )


def _show(report, details: bool, own: bool, json_out, csv_out, junit, markdown) -> None:
    """The table, warnings and summary, and the files asked for."""
    from ..runtime.envinfo import collect_environment
    from .render.ci import emit_markdown, junit_xml, verify_markdown

    stdout.print(verify_table(report, details))
    for line in verify_warnings(report, details, own):
        note(line, style="yellow")
    stdout.print(verify_summary(report, own))
    if json_out is not None:
        report.environment = {**collect_environment().model_dump(), "command": ["dattn", *sys.argv[1:]]}
        emit(json_out, report.model_dump_json(indent=1))
    if csv_out is not None:
        emit_csv(csv_out, [result.model_dump() for result in report.results])
    if junit:
        emit(junit, junit_xml(report))
    if markdown:
        emit_markdown(markdown, verify_markdown(report))


def _note_distributed(impl: list[str] | None, world_sizes: list[int]) -> None:
    """Your configuration on one process: say how the distributed implementations get the same check."""
    from ..kernels.registry import names

    ranked = names(lambda s: s.distributed and not s.single_device and not s.baseline)
    if not impl and world_sizes == [1] and ranked:
        note(
            f"note: {', '.join(ranked)} run on rank groups: add --world-size 2 (or 1,2,4) to check them on this "
            "configuration"
        )


def _checks(o: SimpleNamespace, world, world_sizes: list[int], cases: list, own: bool):
    from ..plan.solve import predicted_peak_bytes
    from ..verify import OWN_PATTERNS, collect_checks

    window = (o.window_left, o.window_right)
    return collect_checks(
        o.impl,
        world_sizes=world_sizes,
        dist_timeout_s=o.dist_timeout,
        dtype=o.dtype,
        attached=world,
        **_axes(own, o.semantics, o.causal, o.both),
        backends=o.backend,
        device=o.device,
        seed=o.seed,
        cases=cases,
        **({"patterns": o.pattern} if o.pattern else {"patterns": OWN_PATTERNS} if own else {}),
        token_window=window if window != (None, None) else None,
        block_size=o.block_size,
        impl_memory=predicted_peak_bytes,
        layout=o.layout,
    )


def _watched(world) -> list:
    """The checks done so far, for the line a fault in an attached world ends with (runtime.heartbeat)."""
    from ..runtime.heartbeat import current

    done: list = []
    if world is not None and (watch := current()) is not None:
        watch.kept = lambda: (
            f"{len(done)} check(s) done, "
            + (f"{sum(not r.passed for r in done)} failed" if any(not r.passed for r in done) else "none failed so far")
            + "; no report written"
        )
    return done


@generated("verify")
def verify(**given: Any) -> None:
    """Equivalence of every implementation against the dense reference, forward and gradients.

    Default: the built-in case matrix (--quick, or --full).

    Your configuration: any of --seq-len --batch --heads --kv-heads --head-dim --documents --segments --dilations
    checks that one.

    Unset there: N 4k, batch 1, 8 heads, head dim 64, segments 2048,4096,8192, dilations 1,2,4, longnet, non-causal.

    --semantics both and --both check it both ways; block-sparse implementations use the patterns built from it.

    Default --impl: every single-device implementation, or every distributed one with --world-size > 1.
    """
    o = SimpleNamespace(**given)
    world_sizes = parse_option("verify", "world_size", o.world_size)
    world = joined(o, world_sizes[0] if len(world_sizes) == 1 else None, OUTPUTS)
    done = _watched(world)
    if world is not None:
        world_sizes = [world.world_size]
    machine_output(o.json_out, o.csv_out, o.junit, o.markdown)
    set_quiet(o.quiet)
    from ..runtime.measure import reuse_freed_memory
    from ..verify import run_checks

    reuse_freed_memory()  # freed chunks stay in the heap: 7x fewer page faults, 7% less time at N = 16K
    cases, own = _cases(o.full, given)
    checks = _checks(o, world, world_sizes, cases, own)
    if own:
        _note_slow_reference(cases, o.device)
        _note_distributed(o.impl, world_sizes)
    with progress() as bar:
        task = bar.add_task("verify", total=checks.total)
        report = run_checks(
            checks, on_result=lambda r: (done.append(r), bar.update(task, advance=1, description=check_line(r)))
        )
    if world is None or world.rank == 0:
        _show(report, o.details, own, o.json_out, o.csv_out, o.junit, o.markdown)
        if o.plot:
            from ..verify import plot_growth

            plot_growth(report.growth, o.plot)
    if (code := agreed_exit_code(world, 0 if report.passed else 1, o.dist_timeout)) != 0:
        raise typer.Exit(code=code)
