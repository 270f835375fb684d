"""The command-line options of the Problem's longer fields (workload/option.py: Cli), named by the field they
belong to in workload/problem.py; the short ones are written on the field itself."""

from __future__ import annotations

from typing import Literal

from .option import (
    ALL,
    BLOCK,
    BLOCK_SPARSE,
    DIST,
    FIELD,
    IMPL,
    LAYER,
    LAYERS,
    MEASURE,
    MEASURED,
    PATTERN,
    PLAN,
    SHAPE,
    Cli,
)
from .parse import parse_float_list, parse_int_list, parse_seq_len, parse_seq_lens

DEFAULT_MODE = "fwdbwd"  # the command line's --mode (bench, plan, profile): what training needs; bench --quick: fwd
IMPL_HELP = "Registered implementation or baseline (sdpa, math, flash, reference); 'dattn impls' lists them"
PATTERN_NAMES = "local, dilated, global_local, hierarchical or longnet"
UNSET_IN_VERIFY = {"verify": {"default": None}}  # verify: a shape option given checks your configuration

# plan: a model's shape option left unset (None) keeps the Problem's default; given, it conflicts with --model


def unset_in_plan(text: str, default: object, forms: dict | None = None) -> dict:
    return {**(forms or {}), "plan": dict(default=None, show_default=False, help=f"{text} Default: {default}.")}


def check_device(value: str) -> str:
    """--device as it is read: cpu, or cuda where a CUDA device is available."""
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here; use --device cpu")
    elif value != "cpu":
        raise ValueError(f"--device {value!r}: use cpu or cuda")
    return value


IMPL_OPTION = Cli(
    IMPL_HELP + ".",
    IMPL,
    ALL,
    metavar="NAME",
    default=None,
    forms={
        "verify": dict(help=IMPL_HELP + "; repeatable.", many=True),
        "bench": dict(help=IMPL_HELP + "; repeatable.", many=True, dest="impls"),
        "profile": dict(default=FIELD),
    },
)

SEQ_LEN_OPTION = Cli(
    "Total sequence length N, e.g. 8k or 65536.",
    SHAPE,
    ALL,
    type=str,
    parse=lambda text, _: parse_seq_len(text),
    default="8k",
    forms={
        "plan": dict(default="64k"),
        "verify": dict(default=None, parse=lambda text, _: parse_seq_lens(text)),
        "bench": dict(
            help="Lengths to measure, comma-separated, e.g. 4k,8k,32768.",
            metavar="N[,N...]",
            default=None,
            parse=lambda text, _: parse_seq_lens(text),
            dest="seq_lens",
        ),
    },
)

SEGMENT_LENGTHS_OPTION, DILATION_RATES_OPTION = (
    Cli(f"{what}, comma-separated.", PATTERN, ALL, names=(name,), type=str, parse=parse_int_list, forms=UNSET_IN_VERIFY)
    for what, name in (("Segment lengths", "--segments"), ("Dilation rates", "--dilations"))
)

BLOCK_SIZE_OPTION = Cli(
    "Block size in tokens.",
    BLOCK,
    ("verify", *BLOCK_SPARSE),
    forms={
        "verify": dict(
            help="Block size in tokens of the block-sparse checks (default: 8 on the case matrix, so each case "
            "holds several blocks; 128 on your configuration).",
            default=None,
        )
    },
)

SEMANTICS_OPTION = Cli(
    "Head/pair preset.",
    PATTERN,
    ALL,
    forms={
        "verify": dict(
            help="Head/pair preset to check, or both.",
            type=Literal["longnet", "head_groups", "both"],
            default=None,
        )
    },
)

CAUSAL_OPTION = Cli(
    "Causal mask.",
    PATTERN,
    ALL,
    names=("--causal/--no-causal",),
    forms={"verify": dict(help="Only causal, or only non-causal (default: both).", default=None)},
)

MODE_OPTION = Cli(
    "fwd (forward only) or fwdbwd (forward and backward); default fwdbwd (bench --quick: fwd).",
    SHAPE,
    ("bench", "profile", "plan"),
    choices=True,
    default=DEFAULT_MODE,
    forms={"bench": dict(default=None)},
)

LAYOUT_OPTION = Cli(
    "Shard layout of the ring, all-gather and block-sparse ring classes: contiguous, or zigzag (2p chunks, "
    "rank a holding chunks a and 2p-1-a: balanced causal work).",
    DIST,
    ("verify", "bench", "plan"),
    choices=("contiguous", "zigzag"),
    forms={
        "plan": dict(
            help="Shard layout of the planned problem: contiguous, zigzag (2p chunks, rank a holding chunks a and "
            "2p-1-a), or documents (packed --documents balanced over ranks; ring and all-gather).",
            choices=True,
        )
    },
)

HEAD_PARALLEL_SIZE_OPTION = Cli(
    "Hybrid classes: h of the h x ring layout, ranks per head group (dividing --world-size and --heads); "
    "default 2 where it divides both, else 1.",
    DIST,
    ("verify", "bench"),
)

WORLD_SIZE_OPTION = Cli(
    "Ranks per point for distributed implementations (gloo on CPU, NCCL on CUDA), spawned here "
    "(at most 4 per CPU core).",
    DIST,
    ("verify", "bench", "plan"),
    forms={
        "verify": dict(
            help="Process-group sizes for distributed implementations, e.g. 1,2,4 (gloo, spawned here; at "
            "most 4 ranks per CPU core).",
            type=str,
            parse=parse_int_list,
            default="1",
        ),
        "plan": dict(
            names=("--world-size", "--devices"),
            help="Devices: for --target attention those sharing the sequence; for --target model "
            "all devices of the training job, data parallel x --sequence-parallel (at most 2**20).",
        ),
    },
)

BACKEND_OPTION = Cli(
    "Attention backend of the dilated blocks (repeatable): auto, math, sdpa, flash.",
    IMPL,
    ("verify", "plan"),
    metavar="NAME",
    many=True,
    default=None,
    forms={
        "plan": dict(  # plan/efficiency.py KERNELS
            names=("--kernel",),
            help="Dense attention kernel the time model assumes for the attention (dilated: for its "
            "blocks); auto: the baseline itself, flash for fp16/bf16 on a GPU, else sdpa (docs/plan.md).",
            panel=PLAN,
            choices=("auto", "flash", "flash3", "cudnn", "sdpa", "flex", "math"),
            metavar=None,
            many=False,
            default="auto",
        )
    },
)

PATTERN_OPTION = Cli(
    f"Block pattern: {PATTERN_NAMES} (default: dilated).",
    BLOCK,
    MEASURED,
    metavar="NAME",
    default=None,
    forms={"verify": dict(help=f"Block patterns to check (repeatable): {PATTERN_NAMES} (default: all).", many=True)},
)

DENSITY_OPTION = Cli(
    "Target block density (picks the window).",
    BLOCK,
    BLOCK_SPARSE,
    forms={
        "bench": dict(
            help="Target block densities, one line each, e.g. 0.05,0.1,0.25.",
            type=str,
            parse=parse_float_list,
            dest="densities",
        )
    },
)

TARGET_HELP = (
    "What is computed: the attention call, one DilatedTransformerBlock, or a LongNetLM (fwdbwd: a "
    "training step with AdamW); docs/layer-claims.md."
)
TARGET_OPTION = Cli(
    TARGET_HELP,
    LAYER,
    LAYERS,
    choices=True,
    forms=unset_in_plan(TARGET_HELP[:-1] + "; --model: the model (or a block, with layer)", "attention"),
)

CHECKPOINTING_OPTION = Cli(
    "Per-block gradient checkpointing (layer/model).",
    LAYER,
    LAYERS,
    names=("--checkpointing/--no-checkpointing",),
)

COMPILED_OPTION = Cli(
    "Measure the module under torch.compile (default inductor backend; the compilation is part of the warm-up).",
    MEASURE,
    ("bench",),
    names=("--compile",),
)

DOCUMENTS_OPTION = Cli(
    "Packed documents' lengths, e.g. 7,100,1,300,57 (batch 1; their sum is N): each attended on its own (cu_seqlens).",
    SHAPE,
    ("verify", "bench", "plan"),
    type=str,
    parse=parse_int_list,
    metavar="L[,L...]",
)

SP_KIND_OPTION = Cli(
    "plan --target model with --sequence-parallel C and a dense --impl: how the sequence is split (ring, default; "
    "allgather; head_parallel, Ulysses; hybrid, USP). A distributed --impl is its own kind.",
    DIST,
    ("plan",),
    choices=True,
)
