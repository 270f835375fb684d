"""What a sweep measures: the configuration, parsed and validated (one ValueError per mistake)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ..kernels.pattern import validate_pattern

BASELINES = ("sdpa", "math", "flash", "reference")
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_seq_lens(text: str) -> list[int]:
    """'4k,8k,32768' -> [4096, 8192, 32768]; k = 1024, m = 1024**2."""
    values = []
    for part in str(text).split(","):
        part = part.strip().lower()
        match = re.fullmatch(r"(\d+)([km]?)", part)
        if not match:
            raise ValueError(f"--seq-lens: {part!r} is not a length; write e.g. 4k,8k,32768")
        value = int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[match.group(2)]
        if value <= 0:
            raise ValueError(f"--seq-lens: {part!r} must be positive")
        values.append(value)
    return values


def parse_size(text: str, option: str = "--max-memory") -> int:
    """'2GiB', '512MB', '1.5g' -> bytes."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{option}: {text!r} is not a size; write e.g. 2GiB, 512MiB or 8GB")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"{option}: {text!r} must be positive")
    return value


def parse_int_list(text: str | list[int], option: str) -> list[int]:
    if isinstance(text, list):
        return [int(x) for x in text]
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of integers, e.g. 2048,4096") from None


def parse_float_list(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of numbers, e.g. 0.05,0.1,0.25") from None


class BenchConfig(BaseModel):
    impls: list[str]
    seq_lens: list[int] = Field(default_factory=list)
    until_oom: bool = False
    start: int = 4096
    mode: Literal["fwd", "fwdbwd"] = "fwd"
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    segment_lengths: list[int] = Field(default_factory=lambda: [2048, 4096, 8192])
    dilation_rates: list[int] = Field(default_factory=lambda: [1, 2, 4])
    semantics: Literal["longnet", "head_groups"] = "longnet"
    causal: bool = False
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    warmup: int = 1
    repeat: int = 3
    max_memory: int
    max_seconds: float = 120.0
    seed: int = 0
    nproc: int = 1  # ranks of a gloo (CPU) / NCCL (CUDA) process group, spawned per point
    dist_timeout: float = 120.0
    # block-sparse implementations only: the pattern, and target densities to sweep (one point each)
    pattern: str = "dilated"
    block_size: int = 128
    window: int | None = None
    densities: list[float] = Field(default_factory=list)
    global_blocks: int = 1
    levels: int = 2
    executor: Literal["auto", "flex", "gather"] = "auto"
    # what is measured: the attention alone, one DilatedTransformerBlock, or a whole LongNetLM (fwdbwd:
    # forward, backward and an AdamW step)
    target: Literal["attention", "layer", "model"] = "attention"
    embed_dim: int | None = None  # layer/model width; default heads * head_dim
    layers: int = 12
    vocab_size: int = 50304
    mlp_ratio: float = 4.0
    checkpointing: bool = False
    amp: Literal["bf16", "fp16"] | None = None

    @field_validator("batch", "heads", "head_dim", "start", "repeat", "nproc", "block_size", "layers", "vocab_size")
    @classmethod
    def _positive(cls, value: int, info) -> int:
        if value <= 0:
            raise ValueError(f"--{info.field_name.replace('_', '-')} must be >= 1, got {value}")
        return value

    @field_validator("warmup")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"--warmup must be >= 0, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "BenchConfig":
        validate_pattern(self.segment_lengths, self.dilation_rates, self.semantics)
        if not self.impls:
            raise ValueError("--impl: give at least one implementation or baseline")
        if self.until_oom == bool(self.seq_lens):
            raise ValueError("give exactly one of --seq-lens and --until-oom")
        if self.max_seconds <= 0:
            raise ValueError(f"--max-seconds must be positive, got {self.max_seconds}")
        if self.dist_timeout <= 0:
            raise ValueError(f"--dist-timeout must be positive, got {self.dist_timeout}")
        if self.target != "attention":
            from ..kernels import REGISTRY

            wrong = [i for i in self.impls if i not in REGISTRY or REGISTRY[i].kind != "multihead"]
            if wrong:
                names = ", ".join(n for n, i in REGISTRY.items() if i.kind == "multihead")
                raise ValueError(f"--target {self.target} builds layers around a multihead attention; {', '.join(wrong)} "
                                 f"is not one: use {names}")
            if self.nproc > 1:
                raise ValueError(f"--target {self.target} runs on one process: drop --nproc")
            if self.embed_dim is not None:
                if self.embed_dim % self.heads:
                    raise ValueError(f"--embed-dim {self.embed_dim} is not divisible by --heads {self.heads}")
                self.head_dim = self.embed_dim // self.heads
            if self.head_dim % 2:
                raise ValueError(f"head dim {self.head_dim} must be even (rotary embeddings): change --embed-dim or --heads")
            if self.target == "model":
                self.causal = True  # a LongNetLM is a causal language model whatever --causal says
        elif self.checkpointing or self.amp:
            raise ValueError("--checkpointing and --amp apply to --target layer or model")
        for density in self.densities or [None]:
            self.block_pattern(density)  # a bad pattern option fails here, naming the option
        if self.nproc > 1:
            from ..kernels import REGISTRY

            single = [i for i in self.impls if i not in REGISTRY or not REGISTRY[i].distributed]
            if single:
                names = ", ".join(n for n, i in REGISTRY.items() if i.distributed)
                raise ValueError(f"--nproc {self.nproc} runs distributed implementations only; {', '.join(single)} "
                                 f"is not one: use {names}, or --nproc 1")
        return self

    def block_options(self, density: float | None = None) -> dict:
        """Constructor keywords of a block-sparse module for this configuration (without the executor)."""
        from ..kernels.block_sparse.patterns import block_sparse_options

        return block_sparse_options(self.pattern, self.segment_lengths, self.dilation_rates, self.semantics,
                                    block_size=self.block_size, window=self.window, global_blocks=self.global_blocks,
                                    levels=self.levels, density=density)

    def block_pattern(self, density: float | None = None):
        from ..kernels.block_sparse.patterns import BlockPattern

        options = self.block_options(density)
        try:
            return BlockPattern(options.pop("pattern"), **options)
        except ValueError as exc:
            raise ValueError(f"--pattern/--density/--window/--block-size: {exc}") from None

    def variants(self, impl: str) -> list[tuple[str, "BenchConfig"]]:
        """(impl, config) per measured line: one per target density for block-sparse implementations."""
        from ..kernels import REGISTRY

        if impl in REGISTRY and REGISTRY[impl].block_sparse and self.densities:
            return [(impl, self.model_copy(update={"densities": [d]})) for d in self.densities]
        return [(impl, self)]

    def pattern_fields(self, impl: str, seq_len: int | None = None) -> dict:
        """Row fields of the block pattern (None for other implementations); densities need seq_len."""
        from ..kernels import REGISTRY
        from ..kernels.block_sparse.patterns import attended_pairs

        if impl not in REGISTRY or not REGISTRY[impl].block_sparse:
            return {"pattern": None}
        p = self.block_pattern(self.densities[0] if self.densities else None)
        fields = {"pattern": p.label() + (f" [{self.executor}]" if self.executor != "auto" else "")}
        if seq_len is not None:
            table = p.table(seq_len, self.heads)
            fields.update(block_density=table.float().mean().item(),
                          element_density=attended_pairs(table, seq_len, p.block_size, self.causal) / seq_len**2)
        return fields

    @property
    def width(self) -> int:
        return self.heads * self.head_dim

    def point_key(self) -> dict:
        """The fields, besides impl and seq_len, that identify a measured point."""
        layer = {"target": "attention", "embed_dim": None, "layers": None, "checkpointing": False, "amp": None,
                 "vocab_size": None}
        if self.target != "attention":
            model = self.target == "model"
            layer = {"target": self.target, "embed_dim": self.width, "layers": self.layers if model else 1,
                     "checkpointing": self.checkpointing, "amp": self.amp, "vocab_size": self.vocab_size if model else None}
        return {**layer,
            "mode": self.mode, "batch": self.batch, "heads": self.heads, "head_dim": self.head_dim,
            "segments": list(self.segment_lengths), "dilations": list(self.dilation_rates),
            "semantics": self.semantics, "causal": self.causal, "dtype": self.dtype, "device": self.device,
            "world_size": self.nproc,
        }
