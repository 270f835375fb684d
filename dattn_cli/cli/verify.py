"""`dattn verify`: every implementation against the dense reference, forward and gradients, on the built-in
case matrix or on the user's own configuration (any shape or pattern option given)."""

from __future__ import annotations

import sys
from typing import Annotated, Any, get_args

import typer

from .attach import agreed_exit_code, attached_world
from .options import (
    AttachOption,
    BackendsOption,
    BatchOption,
    BothOption,
    CausalFilterOption,
    CsvOption,
    DetailsOption,
    DeviceOption,
    DilationsOption,
    DistTimeoutOption,
    DocumentsOption,
    DTypeOption,
    FullOption,
    HeadDimOption,
    HeadsOption,
    ImplsOption,
    JsonOption,
    JunitOption,
    KVHeadsOption,
    MarkdownOption,
    MasterAddrOption,
    MasterPortOption,
    PatternsOption,
    QuietOption,
    SeedOption,
    SegmentsOption,
    SemanticsSetOption,
    SeqLenOption,
    WindowLeftOption,
    WindowRightOption,
    WorldSizeOption,
)
from .render.common import emit, emit_csv, machine_output, note, progress, set_quiet, stdout
from .render.verify import check_line, verify_summary, verify_table, verify_warnings


def unset(alias: Any) -> Any:
    """`alias` (Annotated[type, typer.Option]) taking None for 'not given'."""
    base, *metadata = get_args(alias)
    return Annotated[(base | None, *metadata)]


# Shape and pattern options: not given = the built-in case matrix; any given = that one configuration.
OwnSeqLen, OwnBatch, OwnHeads, OwnHeadDim = (
    unset(SeqLenOption),
    unset(BatchOption),
    unset(HeadsOption),
    unset(HeadDimOption),
)
OwnSegments, OwnDilations, OwnKVHeads = unset(SegmentsOption), unset(DilationsOption), unset(KVHeadsOption)
OwnSemantics = unset(SemanticsSetOption)  # not given: both on the case matrix, longnet on your configuration


def _cases(full: bool, shape: dict[str, Any]) -> tuple[list, bool]:
    """(the cases to check, whether they are the user's own configuration)."""
    from ..verify import case_matrix, own_cases
    from ..workload import parse_int_list, parse_seq_lens

    given = {name: value for name, value in shape.items() if value is not None}
    if not given:
        return case_matrix(full), False
    if full:
        raise ValueError(
            "--full checks the built-in case matrix; drop it to check your configuration "
            f"({', '.join('--' + n.replace('_', '-') for n in given)})"
        )
    documents = parse_int_list(shape["documents"], "--documents") if shape["documents"] is not None else None
    seq_lens = parse_seq_lens(shape["seq_len"]) if shape["seq_len"] is not None else None
    return own_cases(
        seq_lens or ([sum(documents)] if documents else None),
        documents=documents,
        batch=shape["batch"],
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        segment_lengths=parse_int_list(shape["segments"], "--segments") if shape["segments"] is not None else None,
        dilation_rates=parse_int_list(shape["dilations"], "--dilations") if shape["dilations"] is not None else None,
    ), True


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

    stdout.print(verify_table(report, details))
    for line in verify_warnings(report, details, own):
        note(line, style="yellow")
    stdout.print(verify_summary(report, own))
    if json_out is not None:
        report.environment = {**collect_environment().model_dump(), "command": ["dattn", *sys.argv[1:]]}
        emit(json_out, report.model_dump_json(indent=1))
    if csv_out is not None:
        emit_csv(csv_out, [result.model_dump() for result in report.results])
    _ci_outputs(report, junit, markdown)


def _ci_outputs(report, junit: str | None, markdown: str | None) -> None:
    from .render.ci import emit_markdown, junit_xml, verify_markdown

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


def verify(
    impl: ImplsOption = None,
    backend: BackendsOption = None,
    device: DeviceOption = "cpu",
    dtype: DTypeOption = "float32",
    seq_len: OwnSeqLen = None,
    batch: OwnBatch = None,
    heads: OwnHeads = None,
    kv_heads: OwnKVHeads = None,
    head_dim: OwnHeadDim = None,
    documents: DocumentsOption = None,
    segments: OwnSegments = None,
    dilations: OwnDilations = None,
    semantics: OwnSemantics = None,
    causal: CausalFilterOption = None,
    both: BothOption = False,
    pattern: PatternsOption = None,
    window_left: WindowLeftOption = None,
    window_right: WindowRightOption = None,
    full: FullOption = False,
    seed: SeedOption = 0,
    world_size: WorldSizeOption = "1",
    dist_timeout: DistTimeoutOption = 120.0,
    attach: AttachOption = None,
    master_addr: MasterAddrOption = None,
    master_port: MasterPortOption = None,
    json_out: JsonOption = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write a PNG of each implementation's error against N (log-log).")
    ] = None,
    csv_out: CsvOption = None,
    junit: JunitOption = None,
    markdown: MarkdownOption = None,
    details: DetailsOption = False,
    quiet: QuietOption = False,
) -> None:
    """Equivalence of every implementation against the dense reference, forward and gradients.

    Default: the built-in case matrix (--quick, or --full).

    Your configuration: any of --seq-len --batch --heads --kv-heads --head-dim --documents --segments --dilations
    checks that one.

    Unset there: N 4k, batch 1, 8 heads, head dim 64, segments 2048,4096,8192, dilations 1,2,4, longnet, non-causal.

    --semantics both and --both check it both ways; block-sparse implementations use the patterns built from it.

    Default --impl: every single-device implementation, or every distributed one with --world-size > 1.
    """
    from ..workload import parse_int_list

    world_sizes = parse_int_list(world_size, "--world-size")
    world = attached_world(
        attach,
        master_addr,
        master_port,
        world_sizes[0] if len(world_sizes) == 1 else None,
        device.startswith("cuda"),
        dist_timeout,
    )
    if world is not None:  # only rank 0 prints and writes
        world_sizes = [world.world_size]
        quiet, json_out, csv_out, junit, markdown = (
            (quiet, json_out, csv_out, junit, markdown) if world.rank == 0 else (True, None, None, None, None)
        )
    machine_output(json_out, csv_out, junit, markdown)
    set_quiet(quiet)
    from ..plan.solve import predicted_peak_bytes
    from ..verify import OWN_PATTERNS, collect_checks, plot_growth, run_checks

    cases, own = _cases(
        full,
        dict(
            seq_len=seq_len,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            segments=segments,
            dilations=dilations,
            documents=documents,
        ),
    )
    checks = collect_checks(
        impl,
        world_sizes=world_sizes,
        dist_timeout_s=dist_timeout,
        dtype=dtype,
        attached=world,
        **_axes(own, semantics, causal, both),
        backends=backend,
        device=device,
        seed=seed,
        cases=cases,
        **({"patterns": pattern} if pattern else {"patterns": OWN_PATTERNS} if own else {}),
        token_window=(window_left, window_right) if window_left is not None or window_right is not None else None,
        impl_memory=predicted_peak_bytes,
    )
    if own:
        _note_slow_reference(cases, device)
        _note_distributed(impl, world_sizes)
    with progress() as bar:
        task = bar.add_task("verify", total=checks.total)
        report = run_checks(checks, on_result=lambda r: bar.update(task, advance=1, description=check_line(r)))
    if world is None or world.rank == 0:
        _show(report, details, own, json_out, csv_out, junit, markdown)
        if plot:
            plot_growth(report.growth, plot)
    if (code := agreed_exit_code(world, 0 if report.passed else 1, dist_timeout)) != 0:
        raise typer.Exit(code=code)
