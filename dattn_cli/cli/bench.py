"""`dattn bench`: sweep sequence lengths (or densities), each point in an isolated worker."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ..runtime.signals import Interrupted, take_pending
from .attach import agreed_exit_code, attached_world
from .options import (
    DEFAULT_MODE,
    AmpOption,
    AttachOption,
    BaselineOption,
    BatchOption,
    BlockSizeOption,
    CacheOption,
    CausalOption,
    CheckpointingOption,
    CompileOption,
    CsvOption,
    DensitiesOption,
    DeviceOption,
    DilationsOption,
    DistTimeoutOption,
    DocumentsOption,
    DTypeOption,
    EmbedDimOption,
    ExecutorOption,
    FailOnRegressionOption,
    GlobalBlocksOption,
    HeadDimOption,
    HeadsOption,
    ImplsOption,
    InterleaveOption,
    JsonOption,
    KVHeadsOption,
    LayersOption,
    LevelsOption,
    MarkdownOption,
    MasterAddrOption,
    MasterPortOption,
    MaxMemoryOption,
    MaxSecondsOption,
    ModeOption,
    OutOption,
    PatternOption,
    PlotOption,
    PlotXOption,
    PrecisionOption,
    ProcessesOption,
    QuickOption,
    QuietOption,
    RanksOption,
    RepeatOption,
    ResumeOption,
    SeedOption,
    SegmentsOption,
    SemanticsOption,
    SeqLensOption,
    StartOption,
    TargetOption,
    ThreadsOption,
    UntilOomOption,
    VocabSizeOption,
    WarmupOption,
    WindowLeftOption,
    WindowOption,
    WindowRightOption,
    check_ranks,
)
from .render.bench import bench_table, point_line, scaling_lines
from .render.common import emit, emit_json, machine_output, note, progress, set_quiet, stdout

QUICK = {
    "impls": ["DilatedAttention", "ImprovedDilatedAttention", "sdpa"],
    "seq_lens": "2k,4k,8k",
    "segments": "512,1024,2048",
    "dilations": "1,2,4",
}
QUICK_MAX_SECONDS = 10.0  # --quick: adaptive repeats stop within 10 s a point on a noisy machine
# --target layer/model without --impl: the multihead module a user would put in a model
LAYER_DEFAULT_IMPL = "ImprovedMultiheadDilatedAttention"


def default_max_memory() -> int:
    """Half of the memory available right now: the sweep can never drive the host into its OOM killer."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 4 * 2**30


def _command() -> list[str]:
    return ["dattn", *sys.argv[1:]]


def _check_outputs(
    out: Path | None,
    resume: bool,
    baseline: Path | None,
    fail_on_regression: float | None,
    files: dict[str, str | Path | None],
):
    """Every file option checked before anything is measured; the baseline report (None without one)."""
    from ..compare import load_report
    from ..workload.reportfile import check_distinct, check_output_path, check_report_path

    if (fail_on_regression is None) != (baseline is None):
        raise ValueError("--baseline and --fail-on-regression go together: give both")
    if resume and out is None:
        raise ValueError("--resume needs --out FILE.jsonl, the report to continue")
    check_distinct({"--baseline": baseline, "--out": out, **files}, inputs=("--baseline",))
    if out is not None:
        check_report_path(out, "--out")
    for option, path in files.items():
        check_output_path(path, option)
    if baseline is None:
        return None
    loaded = load_report(baseline, "--baseline")
    if not any(side.row.status == "ok" for side in loaded.points):
        raise ValueError(
            f"--baseline {baseline}: no ok point to compare against; give a report `dattn bench --out` wrote"
        )
    return loaded


def _max_memory(max_memory: str | None, out: Path | None, resume: bool) -> int:
    """--max-memory; else, resuming, the cap the report was measured with (the default moves with the free
    memory, and a resumed point must be measured under the same cap); else half of the available memory."""
    from ..workload import parse_size
    from ..workload.records import recorded_setting

    if max_memory:
        return parse_size(max_memory)
    recorded = recorded_setting(out, "max_memory") if resume and out is not None else None
    return recorded if isinstance(recorded, int) and recorded > 0 else default_max_memory()


def _lines(sweep) -> int:
    """Measured lines: one per implementation, one per target density for block-sparse ones."""
    from ..kernels.registry import REGISTRY

    return sum(len(sweep.densities) if REGISTRY[i].block_sparse and sweep.densities else 1 for i in sweep.impls)


def _run(sweep, out: Path | None, resume: bool, world=None):
    from ..bench import run_sweep
    from ..bench.attached import AttachedRunner
    from ..plan.solve import predicted_peak_bytes
    from ..workload.reportfile import ReportWriteError

    try:
        with progress() as bar:
            task = bar.add_task("bench", total=None if sweep.until_oom else _lines(sweep) * len(sweep.seq_lens))

            def on_row(row) -> None:
                bar.update(task, advance=1, description=point_line(row))

            return run_sweep(
                sweep,
                out=out,
                resume=resume,
                command=_command(),
                on_row=on_row,
                predict=predicted_peak_bytes,
                runner=AttachedRunner(world, sweep.dist_timeout) if world is not None else None,
            )
    except ReportWriteError as exc:  # the machine failed, not the input: exit 1
        _fail(f"{exc}; rerun with --resume once there is room")


def _fail(message: str) -> None:
    print(f"dattn: error: {message}", file=sys.stderr)
    raise typer.Exit(code=1)


def _write(sweep, result, csv_out: str | None, json_out: str | None, interrupted: str | None = None) -> None:
    from ..bench import rows_frame

    if csv_out:
        emit(csv_out, rows_frame(result.rows).to_csv(index=False))
    if json_out:
        from ..bench.sweep import environment_record

        environment = result.environment or environment_record(sweep, _command())  # interrupted: no end record
        emit_json(
            json_out,
            {
                "environment": environment,
                **({"interrupted": interrupted} if interrupted else {}),
                "summaries": [s.model_dump() for s in result.summaries],
                "rows": [r.model_dump() for r in result.rows],
            },
        )


def _points(n: int) -> str:
    return f"{n} point{'' if n == 1 else 's'}"


def _interrupted(sweep, exc: Interrupted, out: Path | None, csv_out: str | None, json_out: str | None) -> Interrupted:
    """What a signal leaves: the rows measured before it (each already in --out), --csv/--json of those rows
    (the JSON says "interrupted"), and the sentence saying what was kept."""
    take_pending()  # caught: not delivered again while the files are written
    if exc.partial is None:
        return Interrupted(exc.signum, "before the first point, nothing measured")
    rows = exc.partial.rows
    if rows and (csv_out or json_out):
        try:
            _write(sweep, exc.partial, csv_out, json_out, interrupted=exc.name)
        except OSError:
            pass  # the --out report holds the rows; the message says so
    if out is not None:
        return Interrupted(exc.signum, f"{_points(len(rows))} kept in {out}; rerun with --resume")
    return Interrupted(
        exc.signum,
        f"nothing kept ({_points(len(rows))} measured, no --out): pass --out FILE.jsonl "
        "to keep points as they are measured, and --resume to continue",
    )


def _outputs(
    sweep, result, out: Path | None, csv_out: str | None, json_out: str | None, plot: tuple, markdown: str | None = None
) -> None:
    """--csv, --json and --plot; a file that cannot be written (e.g. the disk filled up after the sweep) is one
    line and exit 1: the input was fine, and the --out report is complete."""
    try:
        _write(sweep, result, csv_out, json_out)
        if plot[0] is not None:
            _plot(sweep, result, *plot)
        if markdown:
            from .render.ci import bench_markdown, emit_markdown

            emit_markdown(markdown, bench_markdown(result.rows))
    except OSError as exc:
        _fail(
            f"cannot write {exc.filename or 'an output file'}: {exc.strerror or exc}"
            + (f"; the report {out} is complete" if out is not None else "")
        )


def _defaults(quick: bool, impl, target: str, segments: str, dilations: str, seq_lens, until_oom: bool, mode):
    """(impl, segments, dilations, seq_lens, mode) after --quick's and the layer target's defaults."""
    mode = mode or ("fwd" if quick else DEFAULT_MODE)
    if not impl and target != "attention":
        impl = [LAYER_DEFAULT_IMPL]
    if quick:
        impl, segments, dilations = impl or QUICK["impls"], QUICK["segments"], QUICK["dilations"]
        seq_lens = seq_lens if seq_lens or until_oom else QUICK["seq_lens"]
    if not impl:
        raise ValueError("--impl: give at least one, e.g. --impl ImprovedDilatedAttention --impl sdpa (or use --quick)")
    return impl, segments, dilations, seq_lens, mode


def _lengths(seq_lens: str | None, documents: str | None) -> dict:
    """The sweep's lengths: --seq-len's; with --documents their sum (the one length they pack) and the lengths."""
    from ..workload import parse_int_list, parse_seq_lens

    docs = parse_int_list(documents, "--documents") if documents else None
    if docs and seq_lens is None:
        seq_lens = str(sum(docs))
    fields = {"seq_lens": parse_seq_lens(seq_lens) if seq_lens else [], "documents": docs}
    return {**fields, "seq_len": sum(docs)} if docs else fields


def _show(
    sweep, result, out: Path | None, csv_out: str | None, json_out: str | None, plot: tuple, markdown: str | None
) -> None:
    stdout.print(bench_table(result))
    for line in scaling_lines(result):
        stdout.print(line, markup=False, highlight=False)
    _outputs(sweep, result, out, csv_out, json_out, plot, markdown)


def _rank_outputs(world, *outputs):
    """(quiet, out, csv, json, markdown, plot, baseline): as given on rank 0; quiet and none on the other ranks."""
    return outputs if world.rank == 0 else (True, None, None, None, None, None, None)


def _exit(world, result, code: int, timeout_s: float) -> None:
    """Exit with `code`, agreed over an attached world's ranks; there a point a rank failed is exit 1 on every
    rank, the rank named (the world is not trusted after it: bench.attached)."""
    if world is not None and (failed := next((r for r in result.rows if r.status == "error"), None)):
        note(f"dattn: error: {failed.error}", style="red")
        code = max(code, 1)
    if (code := agreed_exit_code(world, code, timeout_s)) != 0:
        raise typer.Exit(code=code)


def _plot(sweep, result, plot: Path, plot_x: str | None) -> None:
    from ..bench import plot_rows

    if (plot_x or ("density" if len(sweep.densities) > 1 else "seq_len")) == "density":
        from ..bench.plot import plot_density

        for fit in plot_density(result.rows, plot):
            note(fit.line())
    else:
        plot_rows(result.rows, plot)  # its exponents are the ones printed under the table
    note(f"plot written to {plot}")


def _gate(result, baseline, threshold: float) -> int:
    """The regression gate: dattn compare's test of this run against the baseline; exit 1 on an established
    regression beyond the threshold, 3 when the comparison is inconclusive (noise, or other environments)."""
    from ..compare import compare_rows
    from .render.compare import show_report

    report = compare_rows(baseline, result.rows, threshold, environment=result.environment)
    show_report(report, ("baseline", "this run"), title=f"regression gate (--fail-on-regression {threshold:g}%): ")
    return report.exit_code()


def bench(
    impl: ImplsOption = None,
    device: DeviceOption = "cpu",
    seq_lens: SeqLensOption = None,
    batch: BatchOption = 1,
    heads: HeadsOption = 8,
    kv_heads: KVHeadsOption = None,
    head_dim: HeadDimOption = 64,
    documents: DocumentsOption = None,
    dtype: DTypeOption = "float32",
    mode: ModeOption = None,
    segments: SegmentsOption = "2048,4096,8192",
    dilations: DilationsOption = "1,2,4",
    semantics: SemanticsOption = "longnet",
    causal: CausalOption = False,
    pattern: PatternOption = None,
    block_size: BlockSizeOption = 128,
    window: WindowOption = None,
    window_left: WindowLeftOption = None,
    window_right: WindowRightOption = None,
    density: DensitiesOption = None,
    global_blocks: GlobalBlocksOption = 1,
    levels: LevelsOption = 2,
    executor: ExecutorOption = "auto",
    target: TargetOption = "attention",
    embed_dim: EmbedDimOption = None,
    layers: LayersOption = 12,
    vocab_size: VocabSizeOption = 50304,
    checkpointing: CheckpointingOption = False,
    amp: AmpOption = None,
    quick: QuickOption = False,
    until_oom: UntilOomOption = False,
    start: StartOption = "4k",
    warmup: WarmupOption = None,
    repeat: RepeatOption = None,
    precision: PrecisionOption = 3.0,
    cache: CacheOption = "warm",
    threads: ThreadsOption = None,
    processes: ProcessesOption = None,
    interleave: InterleaveOption = False,
    seed: SeedOption = 0,
    compile_module: CompileOption = False,
    max_memory: MaxMemoryOption = None,
    max_seconds: MaxSecondsOption = None,
    baseline: BaselineOption = None,
    fail_on_regression: FailOnRegressionOption = None,
    world_size: RanksOption = 1,
    dist_timeout: DistTimeoutOption = 120.0,
    attach: AttachOption = None,
    master_addr: MasterAddrOption = None,
    master_port: MasterPortOption = None,
    out: OutOption = None,
    resume: ResumeOption = False,
    csv_out: CsvOption = None,
    json_out: JsonOption = None,
    plot: PlotOption = None,
    plot_x: PlotXOption = None,
    markdown: MarkdownOption = None,
    quiet: QuietOption = False,
) -> None:
    """Sweep sequence lengths: time, memory, TFLOP/s per implementation, each point in an isolated worker."""
    world = attached_world(
        attach, master_addr, master_port, world_size, (device or "").startswith("cuda"), dist_timeout
    )
    if world is not None:  # only rank 0 prints and writes
        world_size, (quiet, out, csv_out, json_out, markdown, plot, baseline) = (
            world.world_size,
            _rank_outputs(world, quiet, out, csv_out, json_out, markdown, plot, baseline),
        )
    machine_output(csv_out, json_out, markdown)
    set_quiet(quiet)
    from ..bench import Sweep
    from ..workload import parse_float_list, parse_int_list, parse_seq_lens

    impl, segments, dilations, seq_lens, mode = _defaults(
        quick, impl, target, segments, dilations, seq_lens, until_oom, mode
    )
    baseline_report = _check_outputs(
        out,
        resume,
        baseline,
        fail_on_regression,
        {"--csv": csv_out, "--json": json_out, "--plot": plot, "--markdown": markdown},
    )
    check_ranks(impl, world_size, "--world-size")
    sweep = Sweep(
        impls=impl,
        until_oom=until_oom,
        start=parse_seq_lens(start)[0],
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        mode=mode,
        **_lengths(seq_lens, documents),
        segment_lengths=parse_int_list(segments, "--segments"),
        dilation_rates=parse_int_list(dilations, "--dilations"),
        semantics=semantics,
        causal=causal,
        device=device,
        warmup=warmup,
        repeat=repeat,
        seed=seed,
        precision=precision,
        cache=cache,
        threads=threads,
        processes=processes or (1 if quick else None),
        interleave=interleave,
        max_memory=_max_memory(max_memory, out, resume),
        max_seconds=max_seconds or (QUICK_MAX_SECONDS if quick else 120.0),
        world_size=world_size,
        attached=world is not None,
        dist_timeout=dist_timeout,
        pattern=pattern or "dilated",
        block_size=block_size,
        window=window,
        window_left=window_left,
        window_right=window_right,
        densities=parse_float_list(density, "--density") if density else [],
        global_blocks=global_blocks,
        levels=levels,
        executor=executor,
        target=target,
        embed_dim=embed_dim,
        layers=layers,
        vocab_size=vocab_size,
        checkpointing=checkpointing,
        amp=amp,
        compiled=compile_module,
    )
    try:
        result = _run(sweep, out, resume, world)
    except Interrupted as exc:
        raise _interrupted(sweep, exc, out, csv_out, json_out) from None
    code = 0
    if world is None or world.rank == 0:
        _show(sweep, result, out, csv_out, json_out, (plot, plot_x), markdown)
        code = _gate(result, baseline_report, fail_on_regression) if baseline is not None else 0
    _exit(world, result, code, dist_timeout)
