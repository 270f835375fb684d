"""The one model of the problem: what attention call (or block, or model step) is verified, measured,
profiled or planned. verify, bench, profile and plan all describe their work as a Problem; a bench
sweep and a profile run add their measurement settings to it (bench/config.py, profile/config.py).
Each field carries its command-line option (`Cli`, workload/option.py): cli/build.py makes the commands'
options from them.

A bad field is refused with one sentence naming the command-line option and the fix. Sizes have stated
bounds (SIZE_LIMITS): far above any real problem, they keep a typo like --seq-len 10**30 from reaching
torch or the planner's arithmetic (2**40 tokens is also where plan --max-seq stops searching).
The kernels are imported where they are used: the command line reads these fields without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, field_validator, model_validator

from .architecture import Architecture, check_layer_target, longnet_architecture
from .option import ALL, BLOCK, BLOCK_SPARSE, IMPL, LAYER, LAYERS, MEASURED, SHAPE, Cli
from .parse import MAX_SEQ_LEN, shown
from .problem_options import (
    BACKEND_OPTION,
    BLOCK_SIZE_OPTION,
    CAUSAL_OPTION,
    CHECKPOINTING_OPTION,
    COMPILED_OPTION,
    DENSITY_OPTION,
    DILATION_RATES_OPTION,
    DOCUMENTS_OPTION,
    HEAD_PARALLEL_SIZE_OPTION,
    IMPL_OPTION,
    LAYOUT_OPTION,
    MODE_OPTION,
    PATTERN_OPTION,
    SEGMENT_LENGTHS_OPTION,
    SEMANTICS_OPTION,
    SEQ_LEN_OPTION,
    SP_KIND_OPTION,
    TARGET_OPTION,
    UNSET_IN_VERIFY,
    WORLD_SIZE_OPTION,
    check_device,
    unset_in_plan,
)

if TYPE_CHECKING:
    from ..kernels.registry import ImplSpec

LAYERS_HELP, VOCAB_HELP = "Model depth (--target model).", "Model vocabulary (--target model)."
ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
# The largest value of each size field (the smallest is 1).
SIZE_LIMITS = {
    "batch": 2**20,
    "seq_len": MAX_SEQ_LEN,
    "heads": 2**16,
    "kv_heads": 2**16,
    "head_dim": 2**16,
    "world_size": 2**20,
    "head_parallel_size": 2**20,
    "block_size": 2**30,
    "layers": 2**16,
    "vocab_size": 2**31,
    "embed_dim": 2**24,
}
MAX_PAIRS = 64  # (segment length, dilation) pairs of a pattern
MAX_DOCUMENTS = 2**20  # packed documents of one sequence
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# the fields a block pattern is made from (kernels/block_sparse/patterns.py: block_sparse_options)
BLOCK_FIELDS = (
    *("pattern", "segment_lengths", "dilation_rates", "semantics", "block_size", "window", "global_blocks"),
    *("levels", "density", "window_left", "window_right"),
)
Target = Literal["attention", "layer", "model"]
ZIGZAG_STRATEGIES = ("ring", "allgather", "hybrid", "block_sparse")  # the registry strategies that take layout="zigzag"


class Problem(BaseModel):
    """What is computed. Each field's `Cli` is its command-line option (workload/option.py): the commands it
    names take it, and a new field with one reaches them all (cli/build.py)."""

    impl: Annotated[str, IMPL_OPTION] = "ImprovedDilatedAttention"
    batch: Annotated[int, Cli("Batch size.", SHAPE, ALL, forms=UNSET_IN_VERIFY)] = 1
    seq_len: Annotated[int, SEQ_LEN_OPTION] = 8192
    heads: Annotated[
        int, Cli("Attention heads.", SHAPE, ALL, forms=unset_in_plan("Attention heads.", 8, UNSET_IN_VERIFY))
    ] = 8
    # GQA/MQA: key/value heads, dividing heads; None = heads (normalised to it)
    kv_heads: Annotated[
        int | None, Cli("Key/value heads (GQA; 1 = MQA); must divide --heads. Default: --heads.", SHAPE, ALL)
    ] = None
    head_dim: Annotated[
        int, Cli("Dimension per head.", SHAPE, ALL, forms=unset_in_plan("Dimension per head.", 64, UNSET_IN_VERIFY))
    ] = 64
    segment_lengths: Annotated[list[int], SEGMENT_LENGTHS_OPTION] = [2048, 4096, 8192]
    dilation_rates: Annotated[list[int], DILATION_RATES_OPTION] = [1, 2, 4]
    semantics: Annotated[Literal["longnet", "head_groups"], SEMANTICS_OPTION] = "longnet"
    causal: Annotated[bool, CAUSAL_OPTION] = False
    dtype: Annotated[
        Literal["float32", "float64", "bfloat16", "float16"], Cli("Input (layer/model: weight) dtype.", SHAPE, ALL)
    ] = "float32"
    device: Annotated[str, Cli("cpu or cuda.", IMPL, MEASURED, check=check_device)] = "cpu"
    mode: Annotated[Literal["fwd", "fwdbwd"], MODE_OPTION] = "fwd"
    world_size: Annotated[int, WORLD_SIZE_OPTION] = 1  # ranks sharing the sequence
    # which positions each rank holds (kernels/distributed/layout.py); zigzag: ring, all-gather, block-sparse,
    # hybrid; documents (plan only): packed documents balanced over the ring and all-gather's ranks
    layout: Annotated[Literal["contiguous", "zigzag", "documents"], LAYOUT_OPTION] = "contiguous"
    # the hybrid classes' ranks per head group (h of h x ring); None: 2 where it fits (distributed/hybrid.py)
    head_parallel_size: Annotated[int | None, HEAD_PARALLEL_SIZE_OPTION] = None
    # plan: how a dense attention is split over --sequence-parallel devices (plan/context.py)
    sp_kind: Annotated[Literal["ring", "allgather", "head_parallel", "hybrid"] | None, SP_KIND_OPTION] = None
    backend: Annotated[str, BACKEND_OPTION] = "auto"  # attention backend of the dilated implementations' blocks
    # block-sparse implementations only
    pattern: Annotated[str, PATTERN_OPTION] = "dilated"
    block_size: Annotated[int, BLOCK_SIZE_OPTION] = 128
    window: Annotated[
        int | None, Cli("Window in blocks each side (local, global_local, hierarchical).", BLOCK, BLOCK_SPARSE)
    ] = None
    density: Annotated[float | None, DENSITY_OPTION] = None  # target block density (picks the window)
    global_blocks: Annotated[int, Cli("global_local: global blocks.", BLOCK, BLOCK_SPARSE)] = 1
    levels: Annotated[int, Cli("hierarchical: dilated levels.", BLOCK, BLOCK_SPARSE)] = 2
    # sliding_window: tokens before / after each query (default block_size)
    window_left: Annotated[
        int | None, Cli("sliding_window: tokens before each query it attends (default: --block-size).", BLOCK, MEASURED)
    ] = None
    window_right: Annotated[
        int | None,
        Cli("sliding_window: tokens after each query (non-causal; default: --block-size).", BLOCK, MEASURED),
    ] = None
    executor: Annotated[
        Literal["auto", "flex", "gather"], Cli("How blocks are computed.", BLOCK, BLOCK_SPARSE, choices=True)
    ] = "auto"
    # what is computed: the attention alone, one DilatedTransformerBlock, or a LongNetLM (fwdbwd: a training
    # step with AdamW); impl is then the multihead attention inside each block
    target: Annotated[Target, TARGET_OPTION] = "attention"
    # layer/model width; default heads x head_dim
    embed_dim: Annotated[int | None, Cli("Layer/model width (default: heads x head dim).", LAYER, LAYERS)] = None
    layers: Annotated[int, Cli(LAYERS_HELP, LAYER, LAYERS, forms=unset_in_plan(LAYERS_HELP, 12))] = 12
    vocab_size: Annotated[int, Cli(VOCAB_HELP, LAYER, LAYERS, forms=unset_in_plan(VOCAB_HELP, 50304))] = 50304
    mlp_ratio: float = 4.0
    checkpointing: Annotated[bool, CHECKPOINTING_OPTION] = False
    amp: Annotated[
        Literal["bf16", "fp16"] | None,
        Cli("Autocast the layer/model (--dtype stays the weights' dtype).", LAYER, LAYERS, choices=True),
    ] = None
    compiled: Annotated[bool, COMPILED_OPTION] = False  # the module measured under torch.compile (bench --compile)
    # packed documents' lengths (cu_seqlens), summing to seq_len; batch 1
    documents: Annotated[list[int] | None, DOCUMENTS_OPTION] = None
    # a model's block and ends (workload/architecture.py; plan --model, --model-config); None: dattn's LongNetLM
    architecture: Architecture | None = None

    @field_validator("impl")
    @classmethod
    def _registered(cls, value: str) -> str:
        from ..kernels.registry import REGISTRY

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
        from ..kernels.heads import divisors
        from ..kernels.pattern import validate_pattern
        from ..kernels.registry import names

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
            if self.architecture is not None:
                raise ValueError(f"{self.architecture.name} is a model: plan it with --target model (or layer)")
        else:
            check_layer_target(self)
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
        if self.spec.strategy == "hybrid" and self.world_size > 1 and self.world_size % self.hybrid_size:
            raise ValueError(
                f"--head-parallel-size {self.hybrid_size} does not divide --world-size {self.world_size}: "
                "use a divisor of the world size (h of h x ring)"
            )
        if self.layout != "contiguous":
            self._check_layout()
        return self

    def _check_layout(self) -> None:
        if reason := self.layout_refusal(self.layout):
            raise ValueError(reason)

    def layout_refusal(self, layout: str) -> str | None:
        """Why this problem's implementation cannot take shard layout `layout` (one sentence naming the
        option and the fix), or None. verify's case matrix keeps such checks contiguous."""
        from ..kernels.registry import names

        if layout == "contiguous":
            return None
        if layout == "documents":
            return self._documents_refusal()
        zigzag = lambda s: s.strategy in ZIGZAG_STRATEGIES  # noqa: E731
        split = self.spec.strategy == "dense" and (self.sp_kind or "ring") in ZIGZAG_STRATEGIES  # plan/context.py
        if not zigzag(self.spec) and not (split and self.target == "model"):
            return (
                f"--layout {layout}: {self.impl} holds contiguous shards only; use one of "
                f"{', '.join(names(zigzag))}, or --layout contiguous"
            )
        if self.documents is not None:
            return f"--layout {layout} does not take packed --documents: use --layout contiguous"
        if self.spec.block_sparse and self.pattern == "sliding_window":
            return f"--layout {layout} does not take --pattern sliding_window (halo rows): use --layout contiguous"
        return None

    def _documents_refusal(self) -> str | None:
        from ..kernels.registry import names

        if self.documents is None:
            return "--layout documents balances packed --documents: give --documents, or use --layout zigzag"
        if self.spec.strategy not in ("ring", "allgather"):
            return (
                f"--layout documents: {self.impl} does not balance packed documents; use one of "
                f"{', '.join(names(lambda s: s.strategy in ('ring', 'allgather')))}, or --layout contiguous"
            )
        return None

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

    @property
    def spec(self) -> ImplSpec:
        from ..kernels.registry import REGISTRY

        return REGISTRY[self.impl]

    @property
    def strategy(self) -> str:
        """How this problem's work is split: ring, allgather or head_parallel over its ranks, else single."""
        sharded = self.world_size > 1 and self.spec.strategy in ("ring", "allgather", "head_parallel")
        return self.spec.strategy if sharded else "single"

    @property
    def hybrid_size(self) -> int:
        """h of a hybrid problem: head_parallel_size, else its default (kernels/registry.hybrid_size)."""
        from ..kernels.registry import hybrid_size

        return hybrid_size(self, self.world_size)

    @property
    def kv_head_count(self) -> int:
        """H_kv: the key/value heads (= heads without GQA)."""
        return self.kv_heads or self.heads

    @property
    def width(self) -> int:
        """E, the model's width: H x D, or a named architecture's own (its head dim need not be E / H)."""
        if self.architecture is not None and self.embed_dim is not None:
            return self.embed_dim
        return self.heads * self.head_dim

    @property
    def attention_width(self) -> int:
        """H x D, the width of the q projection and of the attention's output."""
        return self.heads * self.head_dim

    @property
    def arch(self) -> Architecture:
        """The architecture planned: the given one, or LongNetLM's in the same terms."""
        return self.architecture or longnet_architecture(self)

    @property
    def compute_dtype(self) -> str:
        return AMP_DTYPES[self.amp] if self.amp else self.dtype

    @property
    def hidden(self) -> int:
        """F, the MLP's intermediate size."""
        if self.architecture is not None:
            return self.architecture.intermediate_size
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

        return block_sparse_options(**{name: getattr(self, name) for name in BLOCK_FIELDS})

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
