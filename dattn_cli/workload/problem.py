"""The one model of the problem: what attention call (or block, or model step) is verified, measured,
profiled or planned. verify, bench, profile and plan all describe their work as a Problem; a bench
sweep and a profile run add their measurement settings to it (bench/config.py, profile/config.py).

A bad field is refused with one sentence naming the command-line option and the fix. Sizes have stated
bounds (SIZE_LIMITS): far above any real problem, they keep a typo like --seq-len 10**30 from reaching
torch or the planner's arithmetic (2**40 tokens is also where plan --max-seq stops searching).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

from ..kernels.heads import divisors
from ..kernels.pattern import validate_pattern
from ..kernels.registry import REGISTRY, ImplSpec, names
from .parse import MAX_SEQ_LEN, shown

ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
# The largest value of each size field (the smallest is 1).
SIZE_LIMITS = {
    "batch": 2**20,
    "seq_len": MAX_SEQ_LEN,
    "heads": 2**16,
    "kv_heads": 2**16,
    "head_dim": 2**16,
    "world_size": 2**20,
    "block_size": 2**30,
    "layers": 2**16,
    "vocab_size": 2**31,
    "embed_dim": 2**24,
}
MAX_PAIRS = 64  # (segment length, dilation) pairs of a pattern
MAX_DOCUMENTS = 2**20  # packed documents of one sequence
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
Target = Literal["attention", "layer", "model"]


class Problem(BaseModel):
    impl: str = "ImprovedDilatedAttention"
    batch: int = 1
    seq_len: int = 8192
    heads: int = 8
    kv_heads: int | None = None  # GQA/MQA: key/value heads, dividing heads; None = heads (normalised to it)
    head_dim: int = 64
    segment_lengths: list[int] = [2048, 4096, 8192]
    dilation_rates: list[int] = [1, 2, 4]
    semantics: Literal["longnet", "head_groups"] = "longnet"
    causal: bool = False
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    mode: Literal["fwd", "fwdbwd"] = "fwd"
    world_size: int = 1  # ranks sharing the sequence
    backend: str = "auto"  # attention backend of the dilated implementations' blocks
    # block-sparse implementations only
    pattern: str = "dilated"
    block_size: int = 128
    window: int | None = None
    density: float | None = None  # target block density (picks the window)
    global_blocks: int = 1
    levels: int = 2
    window_left: int | None = None  # sliding_window: tokens before / after each query (default block_size)
    window_right: int | None = None
    executor: Literal["auto", "flex", "gather"] = "auto"
    # what is computed: the attention alone, one DilatedTransformerBlock, or a LongNetLM (fwdbwd: a training
    # step with AdamW); impl is then the multihead attention inside each block
    target: Target = "attention"
    embed_dim: int | None = None  # layer/model width; default heads x head_dim
    layers: int = 12
    vocab_size: int = 50304
    mlp_ratio: float = 4.0
    checkpointing: bool = False
    amp: Literal["bf16", "fp16"] | None = None
    compiled: bool = False  # the module measured under torch.compile (bench --compile)
    documents: list[int] | None = None  # packed documents' lengths (cu_seqlens), summing to seq_len; batch 1

    @field_validator("impl")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in REGISTRY:
            raise ValueError(f"--impl {shown(value)} is unknown: use one of {', '.join(REGISTRY)} (see 'dattn impls')")
        return value

    @field_validator(*SIZE_LIMITS)
    @classmethod
    def _positive(cls, value: int | None, info) -> int | None:
        if value is None:  # embed_dim: heads x head_dim
            return value
        option, limit = "--" + info.field_name.replace("_", "-"), SIZE_LIMITS[info.field_name]
        if value <= 0:
            raise ValueError(f"{option} must be >= 1, got {value}")
        if value > limit:
            raise ValueError(
                f"{option} {value:,} is more than dattn handles ({limit:,} = 2**{limit.bit_length() - 1}): "
                f"give {option} between 1 and {limit:,}"
            )
        return value

    @field_validator("segment_lengths", "dilation_rates")
    @classmethod
    def _pattern_sizes(cls, value: list[int], info) -> list[int]:
        """The pattern's meaning is checked by kernels.pattern; here its size: a handful of pairs is the use."""
        option = "--segments" if info.field_name == "segment_lengths" else "--dilations"
        if len(value) > MAX_PAIRS:
            raise ValueError(f"{option}: {len(value)} values, more than dattn takes ({MAX_PAIRS} pairs)")
        if any(v > MAX_SEQ_LEN for v in value):
            raise ValueError(f"{option}: {max(value):,} is more than dattn handles (2**40 = {MAX_SEQ_LEN:,})")
        return value

    @field_validator("window", "global_blocks", "levels", "window_left", "window_right")
    @classmethod
    def _block_counts(cls, value: int | None, info) -> int | None:
        """Block-pattern counts: the pattern checks their meaning, here only that they are sane numbers."""
        limit = 64 if info.field_name == "levels" else MAX_SEQ_LEN if info.field_name.startswith("window_") else 2**30
        if value is not None and not 0 <= value <= limit:
            option = "--" + info.field_name.replace("_", "-")
            raise ValueError(f"{option} must be from 0 to {limit:,}, got {value:,}")
        return value

    @field_validator("mlp_ratio")
    @classmethod
    def _finite_ratio(cls, value: float) -> float:
        if not 0 < value <= 1024:  # NaN fails too
            raise ValueError(f"mlp_ratio must be in (0, 1024], got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Problem:
        validate_pattern(self.segment_lengths, self.dilation_rates, self.semantics)
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                f"--kv-heads {self.kv_heads} does not divide --heads {self.heads}: use one of "
                f"{divisors(self.heads)} (each kv head serves heads / kv-heads query heads)"
            )
        if self.kv_heads == self.heads:
            self.kv_heads = None  # plain multi-head attention: rows and reports as without the option
        if self.target == "attention":
            if self.checkpointing or self.amp:
                raise ValueError("--checkpointing and --amp apply to --target layer or model")
        else:
            self._check_layer_target()
            if self.compiled:
                raise ValueError("--compile applies to --target attention: drop it for layers and models")
        if self.documents is not None:
            self._check_documents()
        if self.world_size > self.seq_len:
            raise ValueError(
                f"--world-size {self.world_size:,} is more than N={self.seq_len:,}: each rank needs at "
                "least one position; use fewer ranks or a longer --seq-len"
            )
        if self.world_size > 1 and not self.spec.distributed:
            raise ValueError(
                f"--world-size {self.world_size}: {self.impl} runs on one process; use a distributed "
                f"implementation ({', '.join(names(lambda s: s.distributed))}) or --world-size 1"
            )
        if self.spec.block_sparse:
            self.block_pattern()  # a bad pattern option fails here, naming the option
        return self

    def _check_documents(self) -> None:
        docs = self.documents
        if not docs or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in docs):
            raise ValueError("--documents takes document lengths >= 1, e.g. 7,100,1,300,57")
        if len(docs) > MAX_DOCUMENTS:
            raise ValueError(f"--documents: {len(docs):,} documents, more than dattn takes ({MAX_DOCUMENTS:,})")
        if sum(docs) != self.seq_len:
            raise ValueError(
                f"--documents sum to {sum(docs):,} tokens but --seq-len is {self.seq_len:,}: give lengths "
                "that add up to the packed sequence"
            )
        if self.batch != 1:
            raise ValueError(f"--documents packs one sequence: use --batch 1, got {self.batch}")
        if self.target != "attention" or self.spec.baseline or self.compiled:
            raise ValueError(
                "--documents applies to the attention implementations (not baselines, layers, models or --compile)"
            )

    def _check_layer_target(self) -> None:
        spec = self.spec
        if spec.kind != "multihead" or spec.baseline:
            raise ValueError(
                f"--target {self.target} builds layers around a multihead attention; {self.impl} is not "
                f"one: use {', '.join(names(lambda s: s.kind == 'multihead'))}"
            )
        if self.world_size > 1:
            raise ValueError(f"--target {self.target} runs on one device: drop --world-size")
        if self.embed_dim is not None:
            if self.embed_dim % self.heads:
                raise ValueError(f"--embed-dim {self.embed_dim} is not divisible by --heads {self.heads}")
            self.head_dim = self.embed_dim // self.heads
        if self.head_dim % 2:
            raise ValueError(
                f"head dim {self.head_dim} must be even (rotary embeddings): change --embed-dim or --heads"
            )
        self.embed_dim = self.heads * self.head_dim
        if self.target == "model":
            self.causal = True  # a LongNetLM is a causal language model
        else:
            self.layers = 1

    @property
    def spec(self) -> ImplSpec:
        return REGISTRY[self.impl]

    @property
    def strategy(self) -> str:
        """How this problem's work is split: ring, allgather or head_parallel over its ranks, else single."""
        sharded = self.world_size > 1 and self.spec.strategy in ("ring", "allgather", "head_parallel")
        return self.spec.strategy if sharded else "single"

    @property
    def kv_head_count(self) -> int:
        """H_kv: the key/value heads (= heads without GQA)."""
        return self.kv_heads or self.heads

    @property
    def width(self) -> int:
        return self.heads * self.head_dim

    @property
    def compute_dtype(self) -> str:
        return AMP_DTYPES[self.amp] if self.amp else self.dtype

    @property
    def hidden(self) -> int:
        return int(self.width * self.mlp_ratio)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    def with_(self, **changes) -> Problem:
        """A validated copy with some fields changed (model_copy does not validate)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    def block_options(self) -> dict:
        """Constructor keywords of this problem's block-sparse module (without the executor)."""
        from ..kernels.block_sparse.patterns import block_sparse_options

        return block_sparse_options(
            self.pattern,
            self.segment_lengths,
            self.dilation_rates,
            self.semantics,
            block_size=self.block_size,
            window=self.window,
            global_blocks=self.global_blocks,
            levels=self.levels,
            density=self.density,
            window_left=self.window_left,
            window_right=self.window_right,
        )

    def block_pattern(self):
        from ..kernels.block_sparse.patterns import BlockPattern

        options = self.block_options()
        try:
            return BlockPattern(options.pop("pattern"), **options)
        except ValueError as exc:
            raise ValueError(f"--pattern/--density/--window/--block-size: {exc}") from None

    def document_problems(self) -> list[Problem]:
        """One problem per packed document (each attended on its own), or [self] without documents."""
        if self.documents is None:
            return [self]
        return [self.model_copy(update={"seq_len": n, "documents": None}) for n in self.documents]

    def attention_problem(self) -> Problem:
        """One block's attention call of a layer/model problem, in the compute dtype, on one device."""
        return self.model_copy(
            update={
                "target": "attention",
                "dtype": self.compute_dtype,
                "world_size": 1,
                "amp": None,
                "checkpointing": False,
            }
        )
