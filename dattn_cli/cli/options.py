"""Every command-line option, defined once: name, help, validation and help section.

A command declares `seq_len: SeqLenOption = "8k"`: the alias carries everything but the default, so
the same option reads and validates the same in every command while each command keeps its default.
Choices whose error message names the option and the fix (--mode 'bwd': use fwd or fwdbwd) are
checked by a callback; the rest by their type.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import typer

SHAPE, PATTERN, BLOCK, LAYER = "Shape", "Pattern", "Block-sparse", "Layer/model"
IMPL, MEASURE, OUTPUT, DIST, PLAN = "Implementation", "Measurement", "Output", "Distributed", "Plan"

DType = Literal["float32", "float64", "bfloat16", "float16"]
Semantics = Literal["longnet", "head_groups"]


def one_of(option: str, choices: tuple[str, ...]) -> Callable[[str | None], str | None]:
    """A callback refusing values outside `choices` with one sentence naming the option and the fix."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"{option} {value!r}: use {', '.join(choices[:-1])} or {choices[-1]}")
        return value

    return check


def finite(option: str, low: float, high: float, low_open: bool = False) -> Callable[[float | None], float | None]:
    """A callback refusing NaN, infinities and values outside [low, high] ((low, high] with `low_open`), naming
    the option and the range (click's own ranges let NaN through)."""

    def check(value: float | None) -> float | None:
        from ..workload.parse import check_number

        return value if value is None else check_number(option, value, low, high, low_open=low_open)

    return check


def check_device(value: str) -> str:
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here; use --device cpu")
    elif value != "cpu":
        raise ValueError(f"--device {value!r}: use cpu or cuda")
    return value


def check_ranks(impls: list[str], ranks: int, option: str) -> None:
    """More than one rank takes distributed implementations only: refused naming this command's option."""
    from ..kernels.registry import REGISTRY, names

    single = [i for i in impls if i in REGISTRY and not REGISTRY[i].distributed]
    if ranks > 1 and single:
        raise ValueError(
            f"{option} {ranks} runs distributed implementations only; {', '.join(single)} is not one: "
            f"use {', '.join(names(lambda s: s.distributed))}, or {option} 1"
        )


def _choice(name: str, choices: tuple[str, ...], help: str, panel: str):
    return typer.Option(
        name, help=help, callback=one_of(name, choices), metavar="|".join(choices), rich_help_panel=panel
    )


# --- implementation ---------------------------------------------------------------------------------
_IMPL_HELP = "Registered implementation or baseline (sdpa, math, flash, reference); 'dattn impls' lists them"
ImplOption = Annotated[str | None, typer.Option("--impl", help=_IMPL_HELP + ".", metavar="NAME", rich_help_panel=IMPL)]
ImplsOption = Annotated[
    list[str] | None, typer.Option("--impl", help=_IMPL_HELP + "; repeatable.", metavar="NAME", rich_help_panel=IMPL)
]
BackendsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--backend",
        help="Attention backend of the dilated blocks (repeatable): auto, math, sdpa, flash.",
        metavar="NAME",
        rich_help_panel=IMPL,
    ),
]
DeviceOption = Annotated[
    str, typer.Option("--device", help="cpu or cuda.", callback=check_device, rich_help_panel=IMPL)
]

# --- shape ------------------------------------------------------------------------------------------
SeqLenOption = Annotated[
    str, typer.Option("--seq-len", help="Total sequence length N, e.g. 8k or 65536.", rich_help_panel=SHAPE)
]
SeqLensOption = Annotated[
    str | None,
    typer.Option(
        "--seq-len",
        help="Lengths to measure, comma-separated, e.g. 4k,8k,32768.",
        metavar="N[,N...]",
        rich_help_panel=SHAPE,
    ),
]
BatchOption = Annotated[int, typer.Option("--batch", help="Batch size.", rich_help_panel=SHAPE)]
HeadsOption = Annotated[int, typer.Option("--heads", help="Attention heads.", rich_help_panel=SHAPE)]
KVHeadsOption = Annotated[
    int | None,
    typer.Option(
        "--kv-heads",
        help="Key/value heads (GQA; 1 = MQA); must divide --heads. Default: --heads.",
        rich_help_panel=SHAPE,
    ),
]
DocumentsOption = Annotated[
    str | None,
    typer.Option(
        "--documents",
        help="Packed documents' lengths, e.g. 7,100,1,300,57 (batch 1; their sum is N): each attended on "
        "its own (cu_seqlens).",
        metavar="L[,L...]",
        rich_help_panel=SHAPE,
    ),
]
HeadDimOption = Annotated[int, typer.Option("--head-dim", help="Dimension per head.", rich_help_panel=SHAPE)]
DTypeOption = Annotated[
    DType, typer.Option("--dtype", help="Input (layer/model: weight) dtype.", rich_help_panel=SHAPE)
]
DEFAULT_MODE = "fwdbwd"  # bench, plan and profile alike: what training needs (bench --quick runs fwd)
ModeOption = Annotated[
    str | None,
    _choice(
        "--mode",
        ("fwd", "fwdbwd"),
        "fwd (forward only) or fwdbwd (forward and backward); default fwdbwd (bench --quick: fwd).",
        SHAPE,
    ),
]

# --- pattern ----------------------------------------------------------------------------------------
SegmentsOption = Annotated[
    str, typer.Option("--segments", help="Segment lengths, comma-separated.", rich_help_panel=PATTERN)
]
DilationsOption = Annotated[
    str, typer.Option("--dilations", help="Dilation rates, comma-separated.", rich_help_panel=PATTERN)
]
SemanticsOption = Annotated[Semantics, typer.Option("--semantics", help="Head/pair preset.", rich_help_panel=PATTERN)]
SemanticsSetOption = Annotated[
    Literal["longnet", "head_groups", "both"],
    typer.Option("--semantics", help="Head/pair preset to check, or both.", rich_help_panel=PATTERN),
]
CausalOption = Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask.", rich_help_panel=PATTERN)]
CausalFilterOption = Annotated[
    bool | None,
    typer.Option(
        "--causal/--no-causal", help="Only causal, or only non-causal (default: both).", rich_help_panel=PATTERN
    ),
]
BothOption = Annotated[
    bool, typer.Option("--both", help="Causal and non-causal (the default).", rich_help_panel=PATTERN)
]

# --- block-sparse -----------------------------------------------------------------------------------
_PATTERNS = "local, dilated, global_local, hierarchical or longnet"
PatternOption = Annotated[
    str | None,
    typer.Option(
        "--pattern", help=f"Block pattern: {_PATTERNS} (default: dilated).", metavar="NAME", rich_help_panel=BLOCK
    ),
]
PatternsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pattern",
        help=f"Block patterns to check (repeatable): {_PATTERNS} (default: all).",
        metavar="NAME",
        rich_help_panel=BLOCK,
    ),
]
BlockSizeOption = Annotated[int, typer.Option("--block-size", help="Block size in tokens.", rich_help_panel=BLOCK)]
WindowOption = Annotated[
    int | None,
    typer.Option(
        "--window", help="Window in blocks each side (local, global_local, hierarchical).", rich_help_panel=BLOCK
    ),
]
WindowLeftOption = Annotated[
    int | None,
    typer.Option(
        "--window-left",
        help="sliding_window: tokens before each query it attends (default: --block-size).",
        rich_help_panel=BLOCK,
    ),
]
WindowRightOption = Annotated[
    int | None,
    typer.Option(
        "--window-right",
        help="sliding_window: tokens after each query (non-causal; default: --block-size).",
        rich_help_panel=BLOCK,
    ),
]
DensityOption = Annotated[
    float | None, typer.Option("--density", help="Target block density (picks the window).", rich_help_panel=BLOCK)
]
DensitiesOption = Annotated[
    str | None,
    typer.Option("--density", help="Target block densities, one line each, e.g. 0.05,0.1,0.25.", rich_help_panel=BLOCK),
]
GlobalBlocksOption = Annotated[
    int, typer.Option("--global-blocks", help="global_local: global blocks.", rich_help_panel=BLOCK)
]
LevelsOption = Annotated[int, typer.Option("--levels", help="hierarchical: dilated levels.", rich_help_panel=BLOCK)]
ExecutorOption = Annotated[str, _choice("--executor", ("auto", "flex", "gather"), "How blocks are computed.", BLOCK)]
ShowPatternOption = Annotated[
    Path | None, typer.Option("--show-pattern", help="Write the block mask as a PNG.", rich_help_panel=BLOCK)
]

# --- layer / model ----------------------------------------------------------------------------------
TargetOption = Annotated[
    str,
    _choice(
        "--target",
        ("attention", "layer", "model"),
        "What is computed: the attention call, one DilatedTransformerBlock, or a LongNetLM (fwdbwd: a "
        "training step with AdamW); docs/layer-claims.md.",
        LAYER,
    ),
]
EmbedDimOption = Annotated[
    int | None,
    typer.Option("--embed-dim", help="Layer/model width (default: heads x head dim).", rich_help_panel=LAYER),
]
LayersOption = Annotated[int, typer.Option("--layers", help="Model depth (--target model).", rich_help_panel=LAYER)]
VocabSizeOption = Annotated[
    int, typer.Option("--vocab-size", help="Model vocabulary (--target model).", rich_help_panel=LAYER)
]
CheckpointingOption = Annotated[
    bool,
    typer.Option(
        "--checkpointing/--no-checkpointing",
        help="Per-block gradient checkpointing (layer/model).",
        rich_help_panel=LAYER,
    ),
]
CompileOption = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Measure the module under torch.compile (default inductor backend; the compilation is part "
        "of the warm-up).",
        rich_help_panel=MEASURE,
    ),
]
AmpOption = Annotated[
    str | None,
    _choice("--amp", ("bf16", "fp16"), "Autocast the layer/model (--dtype stays the weights' dtype).", LAYER),
]
OptimizerOption = Annotated[
    str,
    _choice(
        "--optimizer",
        ("adamw", "adam8bit", "sgd", "torch-adamw"),
        "plan --target model: adamw (two fp32 states; half "
        "weights also an fp32 master copy), adam8bit (two 1-byte states + absmax per 256), sgd (fp32 momentum), "
        "torch-adamw (states in the weight dtype, no master copy: what bench's model step runs).",
        LAYER,
    ),
]

# --- measurement ------------------------------------------------------------------------------------
FullOption = Annotated[
    bool, typer.Option("--full/--quick", help="Full case matrix, or the quick one.", rich_help_panel=MEASURE)
]
QuickOption = Annotated[
    bool,
    typer.Option(
        "--quick", help="Small CPU sweep: Dilated, Improved and sdpa at 2k-8k (< 60 s).", rich_help_panel=MEASURE
    ),
]
UntilOomOption = Annotated[
    bool,
    typer.Option(
        "--until-oom",
        help="Double N from --start-seq-len until a point fails, then bisect to 5% below a memory limit "
        "(measured, or predicted); a --max-seconds skip or an error stops the search there.",
        rich_help_panel=MEASURE,
    ),
]
StartOption = Annotated[str, typer.Option("--start-seq-len", help="First N for --until-oom.", rich_help_panel=MEASURE)]
WarmupOption = Annotated[
    int | None,
    typer.Option(
        "--warmup",
        help="Untimed calls before timing (bench's default: until the last 3 are within 10%).",
        rich_help_panel=MEASURE,
        show_default=False,
    ),
]
RepeatOption = Annotated[
    int | None,
    typer.Option(
        "--repeat",
        help="Timed calls per point, a fixed count (default: until --precision is reached).",
        rich_help_panel=MEASURE,
        show_default=False,
    ),
]
PrecisionOption = Annotated[
    float,
    typer.Option(
        "--precision",
        help="Without --repeat: sample until the 95% CI of the median is within +-PCT of it, or --max-seconds.",
        metavar="PCT",
        callback=finite("--precision", 0, 100),
        rich_help_panel=MEASURE,
    ),
]
ProcessesOption = Annotated[
    int | None,
    typer.Option(
        "--processes",
        help="Fresh worker processes per point, sharing --max-seconds, samples pooled: an outlier process "
        "(a VM's host moves) is one of K. Default 3; 1 with --repeat, --quick, --until-oom, --interleave, ranks.",
        rich_help_panel=MEASURE,
        show_default=False,
    ),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="Torch threads per point (per rank). Default: torch's (OMP_NUM_THREADS), but one CPU left "
        "free when that would take them all: on small VMs all-CPU runs differ by up to 1.8x between identical runs.",
        rich_help_panel=MEASURE,
        show_default=False,
    ),
]
CacheOption = Annotated[
    str,
    _choice(
        "--cache",
        ("warm", "cold"),
        "warm, or cold: the last-level cache (GPU L2) overwritten before every timed call.",
        MEASURE,
    ),
]
InterleaveOption = Annotated[
    bool,
    typer.Option(
        "--interleave",
        help="Time the implementations of each N round-robin in one worker (A, B, A, B...): their ratio "
        "survives load that comes and goes.",
        rich_help_panel=MEASURE,
    ),
]
IterationsOption = Annotated[
    int, typer.Option("--iterations", help="Timed calls per setting.", rich_help_panel=MEASURE)
]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the random inputs.", rich_help_panel=MEASURE)]
MaxMemoryOption = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help="Memory cap per point, e.g. 2GiB (CPU default: half of available RAM).",
        rich_help_panel=MEASURE,
    ),
]
MaxSecondsOption = Annotated[
    float | None,
    typer.Option(
        "--max-seconds",
        help="Time budget per point (default 120; --quick 10): a point that cannot fit one timed call "
        "is skipped (reason time); adaptive repeats stop at it.",
        rich_help_panel=MEASURE,
        show_default=False,
    ),
]
BaselineOption = Annotated[
    Path | None, typer.Option("--baseline", help="Earlier JSONL report to compare against.", rich_help_panel=MEASURE)
]
FailOnRegressionOption = Annotated[
    float | None,
    typer.Option(
        "--fail-on-regression",
        help="Exit 1 if a point is slower by more than PCT percent by dattn compare's test; 3 if too noisy to tell.",
        metavar="PCT",
        callback=finite("--fail-on-regression", 0, 1e6),
        rich_help_panel=MEASURE,
    ),
]

# --- distributed ------------------------------------------------------------------------------------
WorldSizeOption = Annotated[
    str,
    typer.Option(
        "--world-size",
        help="Process-group sizes for distributed implementations, e.g. 1,2,4 (gloo, spawned here; at "
        "most 4 ranks per CPU core).",
        rich_help_panel=DIST,
    ),
]
RanksOption = Annotated[
    int,
    typer.Option(
        "--world-size",
        help="Ranks per point for distributed implementations (gloo on CPU, NCCL on CUDA), spawned here "
        "(at most 4 per CPU core).",
        rich_help_panel=DIST,
    ),
]
DevicesOption = Annotated[
    int,
    typer.Option(
        "--world-size",
        "--devices",
        help="Devices: for --target attention those sharing the sequence; for --target model "
        "all devices of the training job, data parallel x --sequence-parallel (at most 2**20).",
        rich_help_panel=DIST,
    ),
]
SequenceParallelOption = Annotated[
    int,
    typer.Option(
        "--sequence-parallel",
        help="--target model: devices sharing each sequence (the attention's ring, all-gather or "
        "head-parallel group; default impl RingMultiheadDilatedAttention); data parallel = --devices / this.",
        rich_help_panel=DIST,
    ),
]
ZeroOption = Annotated[
    int,
    typer.Option(
        "--zero",
        help="--target model over --devices: 0 DDP (replicated, gradients all-reduced), 1 ZeRO-1 (optimizer "
        "states sharded), 2 ZeRO-2 (+ gradients), 3 ZeRO-3 / FSDP full shard (+ parameters).",
        metavar="0|1|2|3",
        callback=lambda v: v if v in (0, 1, 2, 3) else int(one_of("--zero", ("0", "1", "2", "3"))(str(v))),
        rich_help_panel=DIST,
    ),
]
AttachOption = Annotated[
    bool | None,
    typer.Option(
        "--attach/--spawn",
        help="Join the world of the launcher that started dattn (torchrun, srun: detected from its "
        "environment by default) instead of spawning ranks here; --spawn spawns them here even inside such a job.",
        rich_help_panel=DIST,
        show_default=False,
    ),
]
MasterAddrOption = Annotated[
    str | None,
    typer.Option(
        "--master-addr",
        help="Attach: the rendezvous host (default MASTER_ADDR, or srun's first node).",
        rich_help_panel=DIST,
        show_default=False,
    ),
]
MasterPortOption = Annotated[
    int | None,
    typer.Option(
        "--master-port",
        help="Attach: the rendezvous port (default MASTER_PORT, else 29500).",
        rich_help_panel=DIST,
        show_default=False,
    ),
]
DistTimeoutOption = Annotated[
    float,
    typer.Option(
        "--dist-timeout",
        help="Seconds before a stuck process group is ended with an error naming the rank.",
        rich_help_panel=DIST,
    ),
]

# --- plan -------------------------------------------------------------------------------------------
ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        help="Shipped hardware profile name or path to your YAML ('dattn profiles list').",
        rich_help_panel=PLAN,
    ),
]
MemoryOption = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help="Memory per device instead of the profile's, e.g. 2GiB (as bench's --max-memory cap).",
        rich_help_panel=PLAN,
    ),
]
KernelOption = Annotated[
    str,
    _choice(  # plan/efficiency.py KERNELS
        "--kernel",
        ("auto", "flash", "flash3", "cudnn", "sdpa", "flex", "math"),
        "Dense attention kernel the time model assumes for the attention (dilated: for its blocks); auto: the "
        "baseline itself, flash for fp16/bf16 on a GPU, else sdpa (docs/plan.md).",
        PLAN,
    ),
]
MaxSeqOption = Annotated[
    bool,
    typer.Option("--max-seq", help="Solve for the largest N that fits on --world-size devices.", rich_help_panel=PLAN),
]
MinDevicesOption = Annotated[
    bool,
    typer.Option(
        "--min-devices",
        help="Solve for the fewest devices that fit --seq-len (--target attention), or a model's training "
        "step at its --zero stage (--target model).",
        rich_help_panel=PLAN,
    ),
]
CheckOption = Annotated[
    Path | None,
    typer.Option("--check", help="Bench JSONL report: predicted vs measured for every ok row.", rich_help_panel=PLAN),
]
CalibrateOption = Annotated[
    Path | None,
    typer.Option("--calibrate", help="Bench JSONL report to fit efficiency factors from.", rich_help_panel=PLAN),
]
FailIfInfeasibleOption = Annotated[
    bool, typer.Option("--fail-if-infeasible", help="Exit 1 when the plan does not fit.", rich_help_panel=PLAN)
]

# --- output -----------------------------------------------------------------------------------------
JsonOption = Annotated[
    str | None,
    typer.Option(
        "--json", help="Write the result as JSON to this file ('-' = stdout).", metavar="FILE", rich_help_panel=OUTPUT
    ),
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress on stderr (errors and results only).", rich_help_panel=OUTPUT)
]
MarkdownOption = Annotated[
    str | None,
    typer.Option(
        "--markdown",
        help="Write a Markdown summary to this file ('-' = stdout); also appended to $GITHUB_STEP_SUMMARY "
        "when that is set.",
        metavar="FILE",
        rich_help_panel=OUTPUT,
    ),
]
JunitOption = Annotated[
    str | None,
    typer.Option(
        "--junit",
        help="Write JUnit XML to this file ('-' = stdout): one test case per implementation x check.",
        metavar="FILE",
        rich_help_panel=OUTPUT,
    ),
]
CsvOption = Annotated[
    str | None,
    typer.Option(
        "--csv", help="Write all rows as CSV to this file ('-' = stdout).", metavar="FILE", rich_help_panel=OUTPUT
    ),
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="JSONL report, one row appended per point as it is measured; locked while a sweep writes it.",
        rich_help_panel=OUTPUT,
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue --out: points already in it are not measured again. A point it holds that was "
        "measured with other settings (--repeat, --warmup, --max-memory, --max-seconds, --seed, torch threads) is refused, "
        "naming the setting; without --max-memory the report's cap is used. A cut-off last line is removed and measured "
        "again.",
        rich_help_panel=OUTPUT,
    ),
]
PlotOption = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="PNG of time and memory against N (log-log, fitted exponents), or against density (--plot-x density).",
        rich_help_panel=OUTPUT,
    ),
]
PlotXOption = Annotated[
    str | None,
    _choice(
        "--plot-x",
        ("seq_len", "density"),
        "x axis of --plot (default: density when --density has several values).",
        OUTPUT,
    ),
]
TraceOption = Annotated[
    Path | None, typer.Option("--trace", help="Write a torch.profiler Chrome trace here.", rich_help_panel=OUTPUT)
]
DetailsOption = Annotated[
    bool, typer.Option("--details", help="One table row per case, not per implementation.", rich_help_panel=OUTPUT)
]
SaveOption = Annotated[
    Path | None,
    typer.Option("--save", help="With --calibrate: write the calibrated profile here.", rich_help_panel=OUTPUT),
]
