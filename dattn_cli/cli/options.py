"""The options that are not Problem fields (measurement, distributed, plan and output settings), each declared
once as a `Cli` (workload/option.py) naming the commands that take it; the Problem's own options are declared on
its fields. cli/params.py's `typed` turns one into a Typer parameter type; cli/build.py gives each command its options.

The key of an option is its parameter name, and where the option fills a field of a command's settings
(Sweep, ProfileSettings) that field's name: --start-seq-len fills Sweep.start.
"""

from __future__ import annotations

from ..workload.option import (
    ALL,
    BLOCK,
    DIST,
    IMPL,
    MEASURE,
    OUTPUT,
    PATTERN,
    PLAN,
    SHAPE,
    Cli,
)
from ..workload.parse import parse_seq_lens
from .model_options import MODEL_OPTIONS
from .params import FILE, FLAG, PATH, PCT, TEXT, UNSET, UNSET_INT, finite, one_of, typed

__all__ = ["OPTIONS", "ORDER", "Cli", "check_ranks", "finite", "one_of", "typed"]


def _zero_stage(value: int) -> int:
    return value if value in (0, 1, 2, 3) else int(one_of("--zero", ("0", "1", "2", "3"))(str(value)))


def check_ranks(impls: list[str], ranks: int, option: str) -> None:
    """More than one rank takes distributed implementations only: refused naming this command's option."""
    from ..kernels.registry import REGISTRY, names  # where used: the command line imports without torch

    single = [i for i in impls if i in REGISTRY and not REGISTRY[i].distributed]
    if ranks > 1 and single:
        raise ValueError(
            f"{option} {ranks} runs distributed implementations only; {', '.join(single)} is not one: "
            f"use {', '.join(names(lambda s: s.distributed))}, or {option} 1"
        )


OPTIONS: dict[str, Cli] = {
    # --- pattern ------------------------------------------------------------------------------------------
    "both": Cli("Causal and non-causal (the default).", PATTERN, ("verify",), **FLAG),
    # --- block-sparse -------------------------------------------------------------------------------------
    "show_pattern": Cli("Write the block mask as a PNG.", BLOCK, ("profile",), **PATH),
    **MODEL_OPTIONS,
    "full": Cli("Full case matrix, or the quick one.", MEASURE, ("verify",), names=("--full/--quick",), **FLAG),
    "quick": Cli("Small CPU sweep: Dilated, Improved and sdpa at 2k-8k (< 60 s).", MEASURE, ("bench",), **FLAG),
    "until_oom": Cli(
        "Double N from --start-seq-len until a point fails, then bisect to 5% below a memory limit (measured, or "
        "predicted); a --max-seconds skip or an error stops the search there.",
        MEASURE,
        ("bench",),
        **FLAG,
    ),
    "start": Cli(
        "First N for --until-oom.",
        MEASURE,
        ("bench",),
        names=("--start-seq-len",),
        type=str,
        parse=lambda text, _: parse_seq_lens(text)[0],
        default="4k",
    ),
    "iterations": Cli("Timed calls per setting.", MEASURE, ("profile",), type=int, default=20),
    "warmup": Cli(
        "Untimed calls before timing (bench's default: until the last 3 are within 10%).",
        MEASURE,
        ("bench", "profile"),
        **UNSET_INT,
        forms={"profile": dict(default=2)},
    ),
    "repeat": Cli(
        "Timed calls per point, a fixed count (default: until --precision is reached).",
        MEASURE,
        ("bench",),
        **UNSET_INT,
    ),
    "precision": Cli(
        "Without --repeat: sample until the 95% CI of the median is within +-PCT of it, or --max-seconds.",
        MEASURE,
        ("bench",),
        **PCT,
        check=finite("--precision", 0, 100),
        default=3.0,
    ),
    "cache": Cli(
        "warm, or cold: the last-level cache (GPU L2) overwritten before every timed call.",
        MEASURE,
        ("bench",),
        choices=("warm", "cold"),
        default="warm",
    ),
    "threads": Cli(
        "Torch threads per point (per rank). Default: torch's (OMP_NUM_THREADS), but one CPU left free when that "
        "would take them all: on small VMs all-CPU runs differ by up to 1.8x between identical runs.",
        MEASURE,
        ("bench",),
        **UNSET_INT,
    ),
    "processes": Cli(
        "Fresh worker processes per point, sharing --max-seconds, samples pooled: an outlier process (a VM's host "
        "moves) is one of K. Default 3; 1 with --repeat, --quick, --until-oom, --interleave, ranks.",
        MEASURE,
        ("bench",),
        **UNSET_INT,
    ),
    "interleave": Cli(
        "Time the implementations of each N round-robin in one worker (A, B, A, B...): their ratio survives load "
        "that comes and goes.",
        MEASURE,
        ("bench",),
        **FLAG,
    ),
    "seed": Cli("Seed of the random inputs.", MEASURE, ("verify", "bench", "profile"), type=int, default=0),
    "max_memory": Cli(
        "Memory cap per point, e.g. 2GiB (CPU default: half of available RAM).",
        MEASURE,
        ("bench", "plan"),
        **TEXT,
        forms={
            "plan": dict(
                help="Memory per device instead of the profile's, e.g. 2GiB (as bench's --max-memory cap).", panel=PLAN
            )
        },
    ),
    "max_seconds": Cli(
        "Time budget per point (default 120; --quick 10): a point that cannot fit one timed call is skipped "
        "(reason time); adaptive repeats stop at it.",
        MEASURE,
        ("bench",),
        type=float,
        **UNSET,
    ),
    "baseline": Cli("Earlier JSONL report to compare against.", MEASURE, ("bench",), **PATH),
    "fail_on_regression": Cli(
        "Exit 1 if a point is slower by more than PCT percent by dattn compare's test; 3 if too noisy to tell.",
        MEASURE,
        ("bench",),
        **PCT,
        check=finite("--fail-on-regression", 0, 1e6),
        default=None,
    ),
    # --- distributed --------------------------------------------------------------------------------------
    "sequence_parallel": Cli(
        "--target model: devices sharing each sequence (the attention's ring, all-gather or head-parallel group; "
        "default impl RingMultiheadDilatedAttention); data parallel = --devices / this.",
        DIST,
        ("plan",),
        type=int,
        default=1,
    ),
    "tensor_parallel": Cli(
        "--model/--model-config over --devices: Megatron tensor parallelism with sequence parallelism over T "
        "devices, innermost (devices = data parallel x --sequence-parallel x T; docs/plan.md).",
        DIST,
        ("plan",),
        type=int,
        default=1,
    ),
    "gpus_per_node": Cli(
        "plan --target model: devices per node, overriding the profile's devices_per_node: a group inside a node "
        "talks over the intra-node link, one across nodes over the inter-node link (tensor parallel innermost, then "
        "sequence parallel).",
        DIST,
        ("plan",),
        type=int,
        **UNSET,
    ),
    "zero": Cli(
        "--target model over --devices: 0 DDP (replicated, gradients all-reduced), 1 ZeRO-1 (optimizer states "
        "sharded), 2 ZeRO-2 (+ gradients), 3 ZeRO-3 / FSDP full shard (+ parameters).",
        DIST,
        ("plan",),
        type=int,
        metavar="0|1|2|3",
        check=_zero_stage,
        default=0,
    ),
    "dist_timeout": Cli(
        "Seconds before a stuck process group is ended with an error naming the rank.",
        DIST,
        ("verify", "bench"),
        type=float,
        default=120.0,
    ),
    "attach": Cli(
        "Join the world of the launcher that started dattn (torchrun, srun: detected from its environment by "
        "default) instead of spawning ranks here; --spawn spawns them here even inside such a job.",
        DIST,
        ("verify", "bench"),
        names=("--attach/--spawn",),
        type=bool,
        **UNSET,
    ),
    "master_addr": Cli(
        "Attach: the rendezvous host (default MASTER_ADDR, or srun's first node).",
        DIST,
        ("verify", "bench"),
        type=str,
        **UNSET,
    ),
    "master_port": Cli(
        "Attach: the rendezvous port (default MASTER_PORT, else 29500).", DIST, ("verify", "bench"), **UNSET_INT
    ),
    # --- plan ---------------------------------------------------------------------------------------------
    "profile": Cli(
        "Shipped hardware profile name or path to your YAML ('dattn profiles list').",
        PLAN,
        ("plan",),
        type=str,
        default="cpu-host",
    ),
    "max_seq": Cli("Solve for the largest N that fits on --world-size devices.", PLAN, ("plan",), **FLAG),
    "min_devices": Cli(
        "Solve for the fewest devices that fit --seq-len (--target attention), or a model's training step at its "
        "--zero stage (--target model).",
        PLAN,
        ("plan",),
        **FLAG,
    ),
    "check": Cli("Bench JSONL report: predicted vs measured for every ok row.", PLAN, ("plan",), **PATH),
    "calibrate": Cli("Bench JSONL report to fit efficiency factors from.", PLAN, ("plan",), **PATH),
    "fail_if_infeasible": Cli("Exit 1 when the plan does not fit.", PLAN, ("plan",), **FLAG),
    # --- output -------------------------------------------------------------------------------------------
    "out": Cli(
        "JSONL report, one row appended per point as it is measured; locked while a sweep writes it.",
        OUTPUT,
        ("bench",),
        **PATH,
    ),
    "resume": Cli(
        "Continue --out: points already in it are not measured again. A point it holds that was measured with "
        "other settings (--repeat, --warmup, --max-memory, --max-seconds, --seed, torch threads) is refused, naming "
        "the setting; without --max-memory the report's cap is used. A cut-off last line is removed and measured "
        "again.",
        OUTPUT,
        ("bench",),
        **FLAG,
    ),
    "save": Cli("With --calibrate: write the calibrated profile here.", OUTPUT, ("plan",), **PATH),
    "trace": Cli("Write a torch.profiler Chrome trace here.", OUTPUT, ("profile",), **PATH),
    **{
        key: Cli(f"Write {what} to this file ('-' = stdout).", OUTPUT, ALL, names=(name,), **FILE)
        for key, name, what in (("json_out", "--json", "the result as JSON"), ("csv_out", "--csv", "all rows as CSV"))
    },
    "junit": Cli(
        "Write JUnit XML to this file ('-' = stdout): one test case per implementation x check.",
        OUTPUT,
        ("verify",),
        **FILE,
    ),
    "plot": Cli(
        "PNG of time and memory against N (log-log, fitted exponents), or against density (--plot-x density).",
        OUTPUT,
        ("bench", "verify"),
        forms={"verify": dict(help="PNG of each implementation's error, and the naive computation's, against N.")},
        **PATH,
    ),
    "plot_x": Cli(
        "x axis of --plot (default: density when --density has several values).",
        OUTPUT,
        ("bench",),
        choices=("seq_len", "density"),
        default=None,
    ),
    "markdown": Cli(
        "Write a Markdown summary to this file ('-' = stdout); also appended to $GITHUB_STEP_SUMMARY when that is set.",
        OUTPUT,
        ("verify", "bench"),
        **FILE,
    ),
    "details": Cli("One table row per case, not per implementation.", OUTPUT, ("verify",), **FLAG),
    "quiet": Cli(
        "No progress on stderr (errors and results only).",
        OUTPUT,
        ("verify", "bench", "profile"),
        names=("--quiet", "-q"),
        **FLAG,
    ),
}

# --help's order within each panel (the panels in PANELS' order): the options named here first, in this order;
# then the others as they are declared (the Problem's fields, then OPTIONS)
ORDER = {
    IMPL: ("impl", "backend"),
    SHAPE: ("seq_len", "batch", "heads", "kv_heads", "head_dim", "documents"),
    BLOCK: ("pattern", "block_size", "window", "window_left", "window_right"),
    MEASURE: (
        *("full", "quick", "until_oom", "start", "iterations", "warmup", "repeat", "precision", "cache", "threads"),
        *("processes", "interleave", "seed", "compiled"),
    ),
    PLAN: ("profile", "max_memory", "backend"),
}

# the output options of the commands written by hand (compare, env, impls)
JsonOption = typed("json_out", OPTIONS["json_out"])[0]
CsvOption = typed("csv_out", OPTIONS["csv_out"])[0]
MarkdownOption = typed("markdown", OPTIONS["markdown"])[0]
