"""The `dattn` command line: options in, one library call, a renderer out (SPEC §4).

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (one line on stderr; --debug for the
traceback). Progress goes to stderr, tables and data to stdout.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .runtime.envinfo import collect_environment
from .render import env_table, stderr_console, verify_summary, verify_table, verify_warnings

app = typer.Typer(
    name="dattn",
    help="Verify, benchmark, profile and capacity-plan long-context dilated attention.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
stdout = Console(width=None if sys.stdout.isatty() else 120)  # logs and pipes get full tables


class UsageError(ValueError):
    """Bad input that is the user's to fix: one line, exit code 2."""


def _load_config(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"--config {path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of command names to options, e.g. 'verify: {{dtype: float32}}'")
    return data


def _config_default_map(ctx: typer.Context, data: dict, path: Path) -> dict:
    commands = getattr(ctx.command, "commands", {})
    default_map = {}
    for command, options in data.items():
        sub = commands.get(command)
        if sub is None:
            raise UsageError(f"--config {path}: unknown command {command!r}; use one of {', '.join(commands)}")
        if not isinstance(options, dict):
            raise UsageError(f"--config {path}: '{command}' must map option names to values")
        names = {p.name for p in sub.params}
        entry = {}
        for key, value in options.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise UsageError(f"--config {path}: '{command}' has no option {key!r}; see 'dattn {command} --help'")
            entry[name] = value
        default_map[command] = entry
    return default_map


def _version(value: bool) -> None:
    if value:
        stdout.print(f"dattn {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file of options per command (the CLI wins)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if config is not None:
        ctx.default_map = _config_default_map(ctx, _load_config(config), config)


class Semantics(str, Enum):
    longnet = "longnet"
    head_groups = "head_groups"
    both = "both"


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"
    bfloat16 = "bfloat16"
    float16 = "float16"


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available here; use --device cpu")
    elif device != "cpu":
        raise UsageError(f"--device {device!r}: use cpu or cuda")


def _write_json(target: str, payload: dict) -> None:
    """JSON to a file, or to stdout for '-'."""
    text = json.dumps(payload, indent=1, default=str)
    print(text) if target == "-" else Path(target).write_text(text)


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr_console(), transient=True,
    )


@app.command()
def verify(
    impl: Optional[list[str]] = typer.Option(None, "--impl", help="Implementation to check (repeatable; default: all single-device, or all distributed with --world-size)."),
    full: bool = typer.Option(False, "--full/--quick", help="Full case matrix, or the quick one (default)."),
    dtype: DType = typer.Option(DType.float32, "--dtype", help="Input dtype."),
    semantics: Semantics = typer.Option(Semantics.both, "--semantics", help="Head/pair preset to check."),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Only causal, or only non-causal."),
    both: bool = typer.Option(False, "--both", help="Causal and non-causal (the default)."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="Attention backend (repeatable): auto, math, sdpa, flash."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    world_size: str = typer.Option("1", "--world-size", help="Process-group sizes for distributed implementations, e.g. 1,2,4 (gloo, spawned here)."),
    dist_timeout: float = typer.Option(120.0, "--dist-timeout", help="Seconds before a stuck process group is ended with an error naming the rank."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full report as JSON to this file."),
    details: bool = typer.Option(False, "--details", help="One table row per case, not per implementation."),
    pattern: Optional[list[str]] = typer.Option(None, "--pattern", help="Block patterns to check for block-sparse implementations (repeatable; default all)."),
) -> None:
    """Equivalence of every implementation against the dense reference, forward and gradients."""
    from .bench.config import parse_int_list
    from .verify import case_matrix, run_verify

    if both and causal is not None:
        raise UsageError("--both conflicts with --causal/--no-causal: give one of them")
    _check_device(device)
    sems = ["longnet", "head_groups"] if semantics == Semantics.both else [semantics.value]
    causals = [False, True] if causal is None else [causal]
    cases = case_matrix(full)
    with _progress() as progress:
        task = progress.add_task("verify", total=None)
        report = run_verify(
            impl, world_sizes=parse_int_list(world_size, "--world-size"), dist_timeout_s=dist_timeout, full=full, dtype=dtype.value, semantics=sems, causal=causals, backends=backend, device=device,
            seed=seed, cases=cases, on_result=lambda r: progress.advance(task), **({"patterns": pattern} if pattern else {}),
        )
    stdout.print(verify_table(report, details))
    for line in verify_warnings(report, details):
        stderr_console().print(f"[yellow]{line}[/]")
    stdout.print(verify_summary(report))
    if json_out is not None:
        report.environment = {**collect_environment().model_dump(), "command": ["dattn", *sys.argv[1:]]}
        json_out.write_text(report.model_dump_json(indent=1))
    if not report.passed:
        raise typer.Exit(code=1)


QUICK = {"impls": ["DilatedAttention", "ImprovedDilatedAttention", "sdpa"], "seq_lens": "2k,4k,8k",
         "segments": "512,1024,2048", "dilations": "1,2,4"}


def _default_max_memory() -> int:
    """Half of the memory available right now: the sweep can never drive the host into its OOM killer."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 4 * 2**30


@app.command()
def bench(
    impl: Optional[list[str]] = typer.Option(None, "--impl", help="Implementation or baseline (sdpa, math, flash, reference); repeatable."),
    seq_lens: Optional[str] = typer.Option(None, "--seq-lens", help="Lengths to measure, e.g. 4k,8k,32768."),
    until_oom: bool = typer.Option(False, "--until-oom", help="Double N from --start until a point fails, then bisect to 5%."),
    start: str = typer.Option("4k", "--start", help="First N for --until-oom."),
    quick: bool = typer.Option(False, "--quick", help="Small CPU sweep: Dilated, Improved and sdpa at 2k-8k (< 60 s)."),
    mode: str = typer.Option("fwd", "--mode", help="fwd or fwdbwd."),
    batch: int = typer.Option(1, "--batch"),
    heads: int = typer.Option(8, "--heads"),
    head_dim: int = typer.Option(64, "--head-dim"),
    segments: str = typer.Option("2048,4096,8192", "--segments", help="Segment lengths, comma-separated."),
    dilations: str = typer.Option("1,2,4", "--dilations", help="Dilation rates, comma-separated."),
    causal: bool = typer.Option(False, "--causal/--no-causal"),
    dtype: DType = typer.Option(DType.float32, "--dtype"),
    semantics: str = typer.Option("longnet", "--semantics", help="longnet or head_groups."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed calls before timing."),
    repeat: int = typer.Option(3, "--repeat", help="Timed calls per point (median, p10, p90)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory cap per point, e.g. 2GiB (CPU default: half of available RAM)."),
    max_seconds: float = typer.Option(120.0, "--max-seconds", help="Time budget per point; beyond it the point is skipped (reason time)."),
    seed: int = typer.Option(0, "--seed"),
    nproc: int = typer.Option(1, "--nproc", help="Ranks per point for distributed implementations (gloo on CPU, NCCL on CUDA), spawned here."),
    dist_timeout: float = typer.Option(120.0, "--dist-timeout", help="Seconds before a stuck process group is ended with an error naming the rank."),
    out: Optional[Path] = typer.Option(None, "--out", help="JSONL report, one row appended per point as it is measured."),
    resume: bool = typer.Option(False, "--resume", help="Continue --out: points already in it are not measured again."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write all rows as CSV to this file ('-' = stdout)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write environment and rows as JSON to this file ('-' = stdout)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG of time and memory against N (log-log, fitted exponents), or against density (--plot-x density)."),
    plot_x: Optional[str] = typer.Option(None, "--plot-x", help="seq_len or density (default: density when --density has several values)."),
    pattern: str = typer.Option("dilated", "--pattern", help="Block-sparse implementations: local, dilated, global_local, hierarchical or longnet."),
    block_size: int = typer.Option(128, "--block-size", help="Block-sparse: block size in tokens."),
    window: Optional[int] = typer.Option(None, "--window", help="Block-sparse: window in blocks each side (local, global_local, hierarchical)."),
    density: Optional[str] = typer.Option(None, "--density", help="Block-sparse: target block densities, one line each, e.g. 0.05,0.1,0.25."),
    global_blocks: int = typer.Option(1, "--global-blocks", help="Block-sparse global_local: global blocks."),
    levels: int = typer.Option(2, "--levels", help="Block-sparse hierarchical: dilated levels."),
    executor: str = typer.Option("auto", "--executor", help="Block-sparse: auto, flex or gather."),
    target: str = typer.Option("attention", "--target", help="attention, layer (one DilatedTransformerBlock) or model (a LongNetLM; fwdbwd = a training step with AdamW)."),
    embed_dim: Optional[int] = typer.Option(None, "--embed-dim", help="Layer/model width (default heads x head dim)."),
    layers: int = typer.Option(12, "--layers", help="Model depth (--target model)."),
    vocab_size: int = typer.Option(50304, "--vocab-size", help="Model vocabulary (--target model)."),
    checkpointing: bool = typer.Option(False, "--checkpointing/--no-checkpointing", help="Per-block gradient checkpointing (layer/model)."),
    amp: Optional[str] = typer.Option(None, "--amp", help="Autocast the layer/model: bf16 or fp16."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Earlier JSONL report to compare against."),
    fail_on_regression: Optional[float] = typer.Option(None, "--fail-on-regression", help="Exit 1 if a point got slower by more than PCT percent."),
) -> None:
    """Sweep sequence lengths: time, memory, TFLOP/s per implementation, each point in an isolated worker."""
    from .bench import BenchConfig, find_regressions, parse_seq_lens, parse_size, plot_rows, read_rows, rows_frame, run_sweep
    from .bench.config import BASELINES, parse_float_list, parse_int_list
    from .bench.plot import plot_density
    from .kernels import REGISTRY
    from .render import bench_table, regression_table

    if quick:
        impl = impl or QUICK["impls"]
        seq_lens = seq_lens if seq_lens or until_oom else QUICK["seq_lens"]
        segments, dilations = QUICK["segments"], QUICK["dilations"]
    if not impl:
        raise UsageError("--impl: give at least one, e.g. --impl ImprovedDilatedAttention --impl sdpa (or use --quick)")
    for name in impl:
        if name not in REGISTRY and name not in BASELINES:
            raise UsageError(f"--impl {name!r} is unknown: use a registered implementation ({', '.join(REGISTRY)}) "
                             f"or a baseline ({', '.join(BASELINES)})")
    if mode not in ("fwd", "fwdbwd"):
        raise UsageError(f"--mode {mode!r}: use fwd or fwdbwd")
    if (fail_on_regression is None) != (baseline is None):
        raise UsageError("--baseline and --fail-on-regression go together: give both")
    if baseline is not None and not baseline.exists():
        raise UsageError(f"--baseline {baseline}: no such file")
    if resume and out is None:
        raise UsageError("--resume needs --out FILE.jsonl, the report to continue")
    _check_device(device)
    cfg = BenchConfig(
        impls=impl, seq_lens=parse_seq_lens(seq_lens) if seq_lens else [], until_oom=until_oom,
        start=parse_seq_lens(start)[0], mode=mode, batch=batch, heads=heads, head_dim=head_dim,
        segment_lengths=parse_int_list(segments, "--segments"), dilation_rates=parse_int_list(dilations, "--dilations"),
        semantics=semantics, causal=causal, dtype=dtype.value, device=device, warmup=warmup, repeat=repeat,
        max_memory=parse_size(max_memory) if max_memory else _default_max_memory(), max_seconds=max_seconds, seed=seed,
        nproc=nproc, dist_timeout=dist_timeout, pattern=pattern, block_size=block_size, window=window,
        densities=parse_float_list(density, "--density") if density else [], global_blocks=global_blocks, levels=levels,
        executor=executor, target=target, embed_dim=embed_dim, layers=layers, vocab_size=vocab_size,
        checkpointing=checkpointing, amp=amp,
    )
    if plot_x not in (None, "seq_len", "density"):
        raise UsageError(f"--plot-x {plot_x!r}: use seq_len or density")
    lines = sum(len(cfg.variants(i)) for i in cfg.impls)
    with _progress() as progress:
        task = progress.add_task("bench", total=None if until_oom else lines * len(cfg.seq_lens))

        def on_row(row):
            what = f" {row.pattern}" if row.pattern else ""
            progress.update(task, advance=1, description=f"bench {row.impl}{what} N={row.seq_len}: {row.status}")

        result = run_sweep(cfg, out=out, resume=resume, command=["dattn", *sys.argv[1:]], on_row=on_row)
    stdout.print(bench_table(result))
    frame = rows_frame(result.rows)
    if csv_out:
        text = frame.to_csv(index=False)
        print(text, end="") if csv_out == "-" else Path(csv_out).write_text(text)
    if json_out:
        from .bench.sweep import environment_record

        payload = {"environment": environment_record(cfg, ["dattn", *sys.argv[1:]]),
                   "summaries": [s.model_dump() for s in result.summaries], "rows": [r.model_dump() for r in result.rows]}
        _write_json(json_out, payload)
    if plot is not None:
        if (plot_x or ("density" if len(cfg.densities) > 1 else "seq_len")) == "density":
            for fit in plot_density(result.rows, plot):
                stderr_console().print(fit.line())
        else:
            exponents = plot_rows(result.rows, plot)
            for name, fits in exponents.items():
                parts = [f"{q} ~ N^{v:.2f}" for q, v in fits.items() if v is not None]
                if parts:
                    stderr_console().print(f"{name}: " + ", ".join(parts))
    if baseline is not None:
        regressions, matched = find_regressions(result.rows, read_rows(baseline), fail_on_regression)
        stdout.print(regression_table(regressions, matched, fail_on_regression))
        if regressions:
            raise typer.Exit(code=1)


@app.command()
def profile(
    impl: str = typer.Option("ImprovedDilatedAttention", "--impl", help="Registered implementation to profile."),
    seq_len: str = typer.Option("8k", "--seq-len"),
    batch: int = typer.Option(1, "--batch"),
    heads: int = typer.Option(8, "--heads"),
    head_dim: int = typer.Option(64, "--head-dim"),
    segments: str = typer.Option("2048,4096,8192", "--segments"),
    dilations: str = typer.Option("1,2,4", "--dilations"),
    semantics: str = typer.Option("longnet", "--semantics"),
    causal: bool = typer.Option(False, "--causal/--no-causal"),
    dtype: DType = typer.Option(DType.float32, "--dtype"),
    device: str = typer.Option("cpu", "--device"),
    mode: str = typer.Option("fwd", "--mode", help="fwd or fwdbwd."),
    iterations: int = typer.Option(20, "--iterations", help="Timed calls per setting."),
    warmup: int = typer.Option(2, "--warmup"),
    seed: int = typer.Option(0, "--seed"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write a torch.profiler Chrome trace here."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the report as JSON to this file ('-' = stdout)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Block-sparse: local, dilated, global_local, hierarchical or longnet."),
    block_size: int = typer.Option(128, "--block-size", help="Block-sparse: block size in tokens."),
    window: Optional[int] = typer.Option(None, "--window", help="Block-sparse: window in blocks each side."),
    density: Optional[float] = typer.Option(None, "--density", help="Block-sparse: target block density (picks the window)."),
    global_blocks: int = typer.Option(1, "--global-blocks", help="Block-sparse global_local: global blocks."),
    levels: int = typer.Option(2, "--levels", help="Block-sparse hierarchical: dilated levels."),
    executor: str = typer.Option("auto", "--executor", help="Block-sparse: auto, flex or gather."),
    show_pattern: Optional[Path] = typer.Option(None, "--show-pattern", help="Block-sparse: write the block mask as a PNG."),
) -> None:
    """Pattern-cache and memory-pool hit rates, allocator stats, time and peak memory with caches on vs off."""
    from .bench.config import parse_int_list, parse_seq_lens
    from .profiling import run_profile
    from .render import profile_table

    if mode not in ("fwd", "fwdbwd"):
        raise UsageError(f"--mode {mode!r}: use fwd or fwdbwd")
    from .kernels import REGISTRY

    block_sparse = impl in REGISTRY and REGISTRY[impl].block_sparse
    given = {"--pattern": pattern, "--window": window, "--density": density, "--show-pattern": show_pattern}
    if not block_sparse and any(v is not None for v in given.values()):
        options = ", ".join(k for k, v in given.items() if v is not None)
        raise UsageError(f"{options}: block-sparse implementations only; use --impl BlockSparseRingDilatedAttention")
    block_options = None
    if block_sparse:
        block_options = {"pattern": pattern or "dilated", "block_size": block_size, "window": window, "density": density,
                         "global_blocks": global_blocks, "levels": levels, "executor": executor}
    with _progress() as progress:
        progress.add_task(f"profile {impl}", total=None)
        report = run_profile(
            impl, batch=batch, seq_len=parse_seq_lens(seq_len)[0], heads=heads, head_dim=head_dim,
            segment_lengths=parse_int_list(segments, "--segments"), dilation_rates=parse_int_list(dilations, "--dilations"),
            semantics=semantics, causal=causal, dtype=dtype.value, device=device, mode=mode, iterations=iterations,
            warmup=warmup, seed=seed, trace=trace, block_options=block_options,
        )
    stdout.print(profile_table(report))
    if show_pattern is not None:
        from .bench.plot import plot_block_table
        from .profiling import block_table_for

        table = block_table_for(report.config)
        bp = report.block_pattern
        plot_block_table(table, show_pattern, f"{impl}\n{bp.description}, N={report.config.seq_len}"
                         f"{' causal' if causal else ''}; block density {bp.block_density:.3f}", causal)
        stderr_console().print(f"block mask ({table.shape[0]} x {table.shape[1]} blocks) written to {show_pattern}")
    for note in report.notes:
        stderr_console().print(f"[yellow]note: {note}[/]")
    if json_out:
        text = report.model_dump_json(indent=1)
        print(text) if json_out == "-" else Path(json_out).write_text(text)


@app.command()
def env(json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """torch, devices (via NVML), attention backends found here."""
    info = collect_environment()
    if json_:
        print(json.dumps(info.model_dump(), indent=1))
    else:
        stdout.print(env_table(info))


def _one_line(exc: ValueError) -> str:
    """The user-facing sentence of a ValueError; pydantic's validation errors reduced to their message."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError) and exc.errors():
        error = exc.errors()[0]
        message = str(error.get("msg", exc)).removeprefix("Value error, ")
        field = ".".join(str(p) for p in error.get("loc", ()))
        return message if message.startswith("-") or not field else f"{field}: {message}"
    return str(exc) or type(exc).__name__


profiles_app = typer.Typer(help="Hardware profiles: list, show, validate (shipped ones or your own YAML).", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")


@profiles_app.command("list")
def profiles_list() -> None:
    """The shipped profiles: name, device, memory, bf16 / fp32 dense peak, devices per node."""
    from .plan.profiles import load_profile, shipped_profiles
    from .render import profiles_table

    stdout.print(profiles_table({name: load_profile(name) for name in shipped_profiles()}))


@profiles_app.command("show")
def profiles_show(profile: str = typer.Argument(..., help="A shipped profile name or a path to a YAML file.")) -> None:
    """Print one profile as YAML, sources included."""
    from .plan.profiles import dump_profile, load_profile

    print(dump_profile(load_profile(profile)), end="")


@profiles_app.command("validate")
def profiles_validate(paths: Optional[list[str]] = typer.Argument(None, help="Profile names or YAML paths (default: every shipped one).")) -> None:
    """Check profiles against the schema; the first problem is reported as one line, exit 2."""
    from .plan.profiles import load_profile, shipped_profiles

    for name in paths or list(shipped_profiles()):
        profile = load_profile(name)
        stdout.print(f"ok: {name} ({profile.name})")


@app.command()
def plan(
    impl: Optional[str] = typer.Option(None, "--impl", help="Implementation or dense baseline (sdpa, flash, math); for --target layer|model a multihead implementation [default: ImprovedDilatedAttention, or ImprovedMultiheadDilatedAttention for layer|model]."),
    profile: str = typer.Option("cpu-host", "--profile", help="Shipped profile name or path to your YAML."),
    seq_len: str = typer.Option("64k", "--seq-len", help="Total sequence length N."),
    devices: int = typer.Option(1, "--devices", help="Devices sharing the sequence (world size)."),
    batch: int = typer.Option(1, "--batch"),
    heads: int = typer.Option(8, "--heads"),
    head_dim: int = typer.Option(64, "--head-dim"),
    segments: str = typer.Option("2048,4096,8192", "--segments"),
    dilations: str = typer.Option("1,2,4", "--dilations"),
    semantics: str = typer.Option("longnet", "--semantics"),
    causal: bool = typer.Option(False, "--causal/--no-causal"),
    dtype: DType = typer.Option(DType.float32, "--dtype"),
    mode: str = typer.Option("fwdbwd", "--mode", help="fwd or fwdbwd."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Memory per device instead of the profile's, e.g. 2GiB (a bench --max-memory cap)."),
    max_seq: bool = typer.Option(False, "--max-seq", help="Solve for the largest N that fits on --devices."),
    min_devices: bool = typer.Option(False, "--min-devices", help="Solve for the fewest devices that fit --seq-len."),
    check: Optional[Path] = typer.Option(None, "--check", help="Bench JSONL report: predicted vs measured for every ok row."),
    calibrate: Optional[Path] = typer.Option(None, "--calibrate", help="Bench JSONL report to fit efficiency factors from."),
    save: Optional[Path] = typer.Option(None, "--save", help="With --calibrate: write the calibrated profile here."),
    fail_if_infeasible: bool = typer.Option(False, "--fail-if-infeasible", help="Exit 1 when the plan does not fit."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the plan as JSON to this file ('-' = stdout)."),
    target: str = typer.Option("attention", "--target", help="attention (one call), layer (one DilatedTransformerBlock) or model (a LongNetLM training step with AdamW); docs/layer-claims.md."),
    embed_dim: Optional[int] = typer.Option(None, "--embed-dim", help="Layer/model width (default heads x head dim)."),
    layers: int = typer.Option(12, "--layers", help="Model depth (--target model)."),
    vocab_size: int = typer.Option(50304, "--vocab-size", help="Model vocabulary (--target model)."),
    checkpointing: bool = typer.Option(False, "--checkpointing/--no-checkpointing", help="Per-block gradient checkpointing (layer/model)."),
    amp: Optional[str] = typer.Option(None, "--amp", help="Autocast the layer/model: bf16 or fp16 (--dtype stays the weights' dtype)."),
) -> None:
    """Predict memory per device and time per call from a stated model (docs/plan.md), or check it against bench rows."""
    from .bench.config import parse_int_list, parse_seq_lens
    from .plan import check as plan_check
    from .plan import model
    from .plan.memory import Shape
    from .plan.profiles import dump_profile, load_profile
    from .render import check_table, plan_table

    hw = load_profile(profile)
    if memory is not None:
        from .bench.config import parse_size

        hw = hw.model_copy(update={"memory_gib": parse_size(memory, "--memory") / 2**30})
    if mode not in ("fwd", "fwdbwd"):
        raise UsageError(f"--mode {mode!r}: use fwd or fwdbwd")
    if devices < 1:
        raise UsageError(f"--devices must be >= 1, got {devices}")
    if save is not None and calibrate is None:
        raise UsageError("--save goes with --calibrate REPORT.jsonl")
    if calibrate is not None:
        rows = plan_check.ok_rows(calibrate)
        calibrated = plan_check.calibrate(rows, hw, str(calibrate))
        text = dump_profile(calibrated)
        if save is not None:
            save.write_text(text)
            stderr_console().print(f"calibrated profile written to {save}")
        else:
            print(text, end="")
        for impl_name, value in calibrated.efficiency.per_impl.items():
            stderr_console().print(f"{impl_name}: attention efficiency {value:.4f} of peak")
        return
    if check is not None:
        frame = plan_check.check_rows(plan_check.ok_rows(check), hw)
        stats = plan_check.summary(frame)
        stdout.print(check_table(frame, hw.name, stats))
        if json_out:
            payload = {"profile": hw.name, "rows": frame.to_dict(orient="records"), "summary": stats}
            _write_json(json_out, payload)
        return
    fields = dict(seq_len=parse_seq_lens(seq_len)[0], batch=batch, heads=heads, head_dim=head_dim,
                  segment_lengths=parse_int_list(segments, "--segments"), dilation_rates=parse_int_list(dilations, "--dilations"),
                  semantics=semantics, causal=causal, dtype=dtype.value, mode=mode, world_size=devices)
    if target == "attention":
        if checkpointing or amp:
            raise UsageError("--checkpointing and --amp apply to --target layer or model")
        shape = Shape(impl=impl or "ImprovedDilatedAttention", **fields)
    else:
        from .plan.layers import layer_shape

        shape = layer_shape(target, impl or "ImprovedMultiheadDilatedAttention", fields, embed_dim=embed_dim,
                            layers=layers, vocab_size=vocab_size, checkpointing=checkpointing, amp=amp)
    from .kernels.pattern import validate_pattern

    validate_pattern(shape.segment_lengths, shape.dilation_rates, shape.semantics)
    solved = None
    if min_devices and target != "attention":
        raise UsageError(f"--min-devices applies to --target attention; --target {target} is planned on one device")
    if max_seq and min_devices:
        raise UsageError("--max-seq and --min-devices solve for different things: give one")
    if max_seq:
        n, result = model.max_seq(shape, hw, devices)
        solved = f"largest N that fits on {devices} x {hw.name}: {n:,}" if n else f"no N fits on {devices} x {hw.name}"
        result = result or model.plan(shape, hw, devices)
    elif min_devices:
        d, result = model.min_devices(shape, hw)
        solved = (f"fewest devices for N={shape.seq_len:,}: {d}" if d else f"N={shape.seq_len:,} fits on no number of devices")
        result = result or model.plan(shape, hw, devices)
    else:
        result = model.plan(shape, hw, devices)
    advice = model.chunk_advice(result.shape, hw, result.devices)
    stdout.print(plan_table(result, solved, advice))
    if json_out:
        payload = {**result.model_dump(), "solved": solved, "chunk_advice": advice}
        _write_json(json_out, payload)
    if fail_if_infeasible and not result.feasible:
        raise typer.Exit(code=1)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="dattn", standalone_mode=False)
    except Exception as exc:
        # Typer may vendor its own click, so click's exceptions are recognised by shape, not class.
        if type(exc).__name__ == "Abort":
            print("dattn: interrupted", file=sys.stderr)
            sys.exit(130)
        usage = hasattr(exc, "format_message") and hasattr(exc, "exit_code")
        if debug or not (usage or isinstance(exc, ValueError)):
            raise
        # ValueError: bad configuration or input, raised by the library with the fix in its text.
        message = exc.format_message() if usage else _one_line(exc)
        print(f"dattn: error: {message.splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("dattn: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
