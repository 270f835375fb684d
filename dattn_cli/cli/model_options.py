"""The options of a model's training plan (`plan --target model`, `--model`): optimizer, loss, recompute, the
block's kernels and precision, offload and the model's name or config, each declared once as a `Cli`
(workload/option.py); cli/options.py puts them in the one OPTIONS table.
"""

from __future__ import annotations

from ..workload.option import LAYER, PLAN, Cli
from .params import FLAG, PATH, TEXT, UNSET

MODEL_OPTIONS: dict[str, Cli] = {
    "optimizer": Cli(
        "plan --target model: adamw (two fp32 states; half weights also an fp32 master copy), adam8bit (two 1-byte "
        "states + absmax per 256), sgd (fp32 momentum), torch-adamw (states in the weight dtype, no master copy: "
        "what bench's model step runs).",
        LAYER,
        ("plan",),
        choices=("adamw", "adam8bit", "sgd", "torch-adamw"),
        default="adamw",
    ),
    "loss": Cli(
        "plan --target model: standard (the whole logits; training holds 12 bytes per token and vocabulary entry), "
        "chunked (a fused linear cross-entropy, Liger's: one chunk of logits at a time) or compiled (the standard "
        "loss under torch.compile: the logits and their gradient in the compute dtype), docs/plan.md.",
        LAYER,
        ("plan",),
        choices=("standard", "chunked", "compiled"),
        default="standard",
    ),
    "recompute": Cli(
        "plan: none, full (each block keeps its input and runs its forward again: --checkpointing) or selective "
        "(--target model of a --model: torchtitan's op policy, attention and every other matmul output kept).",
        LAYER,
        ("plan",),
        choices=("none", "full", "selective"),
        **UNSET,
    ),
    "tiled_mlp": Cli(
        "plan --model/--model-config: ALST's tiled MLP (the MLP in ceil(N / E) sequence shards, recomputed shard by "
        "shard in the backward: it keeps only its input).",
        LAYER,
        ("plan",),
        **FLAG,
    ),
    "fused_norm": Cli(
        "plan --model/--model-config: the norms as fused kernels (Liger, TransformerEngine, apex or compiled: each "
        "keeps its input and a per-token statistic) instead of transformers' eager RMSNorm (an fp32 input copy).",
        LAYER,
        ("plan",),
        **FLAG,
    ),
    "fp8": Cli(
        "plan --model/--model-config: the blocks' linear layers in FP8, as TransformerEngine (te: FP8 copies of "
        "inputs and weights saved) or torchao (torchtitan's float8: float8 FSDP all-gathers) run them (docs/plan.md).",
        LAYER,
        ("plan",),
        choices=("te", "torchao"),
        **UNSET,
    ),
    "offload": Cli(
        "plan --target model: kept in host memory, comma-separated: activations (--recompute full), optimizer "
        "(ZeRO-Offload, --zero >= 1), parameters (ZeRO-Infinity, --zero 3); needs a profile's host section.",
        LAYER,
        ("plan",),
        metavar="KINDS",
        **TEXT,
    ),
    "model": Cli(
        "Plan a shipped model (implies --target model): its shape and block replace --layers, --embed-dim, --heads, "
        "--kv-heads, --head-dim and --vocab-size; an unknown NAME lists them (docs/plan.md).",
        LAYER,
        ("plan",),
        metavar="NAME",
        **TEXT,
    ),
    "model_config": Cli(
        "Plan the model of a Hugging Face transformers config.json (llama, mistral, qwen2, qwen3), as --model does.",
        LAYER,
        ("plan",),
        **PATH,
    ),
    "dp_shard": Cli(
        "plan --target model: HSDP: ZeRO/FSDP shards over this many of the devices holding the same tensor shard "
        "(consecutive, e.g. a node) and the groups hold copies, their gradient shards all-reduced (default: all).",
        PLAN,
        ("plan",),
        type=int,
        **UNSET,
    ),
    "global_batch_tokens": Cli(
        "plan --target model: tokens per optimizer step over all replicas, e.g. 16M (M = 1024^2): each replica "
        "accumulates over global / (replicas x batch x N) micro-steps; tokens/s per device and MFU at that batch.",
        PLAN,
        ("plan",),
        metavar="TOKENS",
        **TEXT,
    ),
    "search": Cli(
        "plan --model: rank the layouts that fit --devices (tensor parallel, the sequence-parallel kind and degree, "
        "ZeRO stage, recompute, loss, offload) by tokens/s per device at --global-batch-tokens (docs/plan.md).",
        PLAN,
        ("plan",),
        **FLAG,
    ),
}
