"""`dattn profile`: one problem with the pattern cache and memory pool on, then off."""

from __future__ import annotations

from pathlib import Path

from .options import (
    DEFAULT_MODE,
    BatchOption,
    BlockSizeOption,
    CausalOption,
    CsvOption,
    DensityOption,
    DeviceOption,
    DilationsOption,
    DTypeOption,
    ExecutorOption,
    GlobalBlocksOption,
    HeadDimOption,
    HeadsOption,
    ImplOption,
    IterationsOption,
    JsonOption,
    KVHeadsOption,
    LevelsOption,
    ModeOption,
    PatternOption,
    QuietOption,
    SeedOption,
    SegmentsOption,
    SemanticsOption,
    SeqLenOption,
    ShowPatternOption,
    TraceOption,
    WarmupOption,
    WindowLeftOption,
    WindowOption,
    WindowRightOption,
)
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


def profile(
    impl: ImplOption = "ImprovedDilatedAttention",
    device: DeviceOption = "cpu",
    seq_len: SeqLenOption = "8k",
    batch: BatchOption = 1,
    heads: HeadsOption = 8,
    kv_heads: KVHeadsOption = None,
    head_dim: HeadDimOption = 64,
    dtype: DTypeOption = "float32",
    mode: ModeOption = DEFAULT_MODE,
    segments: SegmentsOption = "2048,4096,8192",
    dilations: DilationsOption = "1,2,4",
    semantics: SemanticsOption = "longnet",
    causal: CausalOption = False,
    pattern: PatternOption = None,
    block_size: BlockSizeOption = 128,
    window: WindowOption = None,
    window_left: WindowLeftOption = None,
    window_right: WindowRightOption = None,
    density: DensityOption = None,
    global_blocks: GlobalBlocksOption = 1,
    levels: LevelsOption = 2,
    executor: ExecutorOption = "auto",
    show_pattern: ShowPatternOption = None,
    iterations: IterationsOption = 20,
    warmup: WarmupOption = 2,
    seed: SeedOption = 0,
    trace: TraceOption = None,
    json_out: JsonOption = None,
    csv_out: CsvOption = None,
    quiet: QuietOption = False,
) -> None:
    """Pattern-cache and memory-pool hit rates, allocator stats, time and peak memory with caches on vs off."""
    machine_output(json_out, csv_out)
    set_quiet(quiet)
    from ..profile import run_profile
    from ..workload import Problem, parse_int_list, parse_seq_len

    _refuse_block_options(
        impl, {"--pattern": pattern, "--window": window, "--density": density, "--show-pattern": show_pattern}
    )
    problem = Problem(
        impl=impl,
        seq_len=parse_seq_len(seq_len),
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        mode=mode,
        segment_lengths=parse_int_list(segments, "--segments"),
        dilation_rates=parse_int_list(dilations, "--dilations"),
        semantics=semantics,
        causal=causal,
        device=device,
        pattern=pattern or "dilated",
        block_size=block_size,
        window=window,
        density=density,
        window_left=window_left,
        window_right=window_right,
        global_blocks=global_blocks,
        levels=levels,
        executor=executor,
    )
    with progress() as bar:
        task = bar.add_task(f"profile {impl}", total=2)
        report = run_profile(problem, iterations=iterations, warmup=warmup, seed=seed, trace=trace)
        for setting in (report.caches_on, report.caches_off):  # run_profile reports both settings at its end
            bar.update(task, advance=1, description=setting_line(report, setting))
    stdout.print(profile_table(report))
    if show_pattern is not None:
        _show_pattern(report, show_pattern)
    for line in report.notes:
        note(f"note: {line}", style="yellow")
    if json_out:
        emit(json_out, report.model_dump_json(indent=1))
    if csv_out:  # one line per setting, the problem's fields repeated on each
        problem = report.config.problem.model_dump()
        emit_csv(csv_out, [{"problem": problem, **s.model_dump()} for s in (report.caches_on, report.caches_off)])
