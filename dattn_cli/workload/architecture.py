"""The architecture of a planned model beyond the Problem's sizes (heads, kv_heads, head_dim, layers, vocab_size,
embed_dim): what a block and the model's ends are made of, and the parameter counts that follow from it.

Two block implementations are planned. Without an `Architecture` (Problem.architecture None) the block is dattn's
own `DilatedTransformerBlock` in a `LongNetLM` (models/longnet.py): LayerNorm, a GELU MLP of mlp_ratio x E with
biases, packed q/k/v and out projections with biases around a multihead attention, tied embeddings, D = E / H.
With one (a `--model` preset or a `--model-config` file, model_presets.py) it is the Hugging Face transformers
decoder layer of the Llama, Mistral and Qwen2 families: RMSNorm, a gated MLP (SwiGLU) of its own intermediate size,
separate q, k, v, o projections around a core attention (dense by default), D as the config says.

Parameters of one block (E the width, H·D the attention width, K = H_kv·D, F the intermediate size):
    q E·H·D, k and v E·K each, o H·D·E; biases H·D + 2K (q, k, v) and E (o) where the architecture has them
    gated MLP (SwiGLU): gate and up E·F each, down F·E; plain (GELU): fc1 E·F, fc2 F·E; biases F (per up-like
    matrix) + E where mlp_bias
    two norms: RMSNorm E each (a weight), LayerNorm 2E (weight and bias)
The model adds the embedding V·E, an untied head V·E, and a final norm. LongNetLM is the same formulas with its
fields (longnet_architecture), so its counts did not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, field_validator

if TYPE_CHECKING:
    from .problem import Problem

Mlp = Literal["swiglu", "geglu", "gelu"]  # gated (silu, gelu) or plain GELU
GATED = ("swiglu", "geglu")


class Architecture(BaseModel):
    """A model's block and ends, besides the sizes the Problem holds. `name` and `source` say where it comes from
    (a preset's name and its config.json's address, or a config file's path)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str = ""
    family: str = "llama"  # the transformers model_type whose decoder layer this is (llama, mistral, qwen2)
    intermediate_size: int
    mlp: Mlp = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    tie_word_embeddings: bool = False
    attention_bias: Literal["none", "qkv", "qkvo"] = "none"  # which of the q, k, v, o projections have a bias
    mlp_bias: bool = False
    # plan --tiled-mlp: ALST's TiledMLP (DeepSpeed's ulysses_sp.TiledMLP), the MLP run in sequence shards and
    # recomputed shard by shard in the backward (plan/decoder.py)
    tiled_mlp: bool = False
    # qwen3's RMSNorm of each head's queries and keys (q_norm, k_norm: head_dim weights each)
    qk_norm: bool = False
    # plan --fused-norm: fused norm kernels (Liger, TransformerEngine, apex, compiled) keep their input in the
    # weight dtype and a per-token statistic, not transformers' eager fp32 copy (plan/decoder.py)
    fused_norm: bool = False
    # plan --fp8: the blocks' linear layers in FP8, as TransformerEngine (te) or torchao run them (plan/fp8.py)
    fp8: Literal["te", "torchao"] | None = None

    @field_validator("intermediate_size")
    @classmethod
    def _size(cls, value: int) -> int:
        if not 1 <= value <= 2**24:
            raise ValueError(f"intermediate_size must be from 1 to {2**24:,}, got {value:,}")
        return value

    @property
    def gated(self) -> bool:
        return self.mlp in GATED


def longnet_architecture(p: Problem) -> Architecture:
    """LongNetLM's block and ends in the same terms (models/longnet.py)."""
    return Architecture(
        name="LongNetLM",
        source="dattn_cli/models/longnet.py",
        family="longnet",
        intermediate_size=int(p.width * p.mlp_ratio),
        mlp="gelu",
        norm="layernorm",
        tie_word_embeddings=True,
        attention_bias="qkvo",
        mlp_bias=True,
    )


class Matmul(NamedTuple):
    name: str
    out: int  # output features
    inp: int  # input features
    bias: bool


def block_matmuls(p: Problem) -> list[Matmul]:
    """One block's projections in the order they run: q, k, v, o, then gate and up (or fc1) and down."""
    a, width, attention, kv = p.arch, p.width, p.attention_width, p.kv_head_count * p.head_dim
    biased = a.attention_bias != "none"
    projections = [
        Matmul("q", attention, width, biased),
        Matmul("k", kv, width, biased),
        Matmul("v", kv, width, biased),
        Matmul("o", width, attention, a.attention_bias == "qkvo"),
    ]
    hidden = a.intermediate_size
    mlp = [("gate", hidden, width), ("up", hidden, width)] if a.gated else [("fc1", hidden, width)]
    return projections + [Matmul(name, out, inp, a.mlp_bias) for name, out, inp in [*mlp, ("down", width, hidden)]]


def block_matmul_parameters(p: Problem) -> int:
    """The weights of one block's matrix multiplications: q, k, v, o and the MLP's (their FLOPs are 2·T·this)."""
    return sum(m.out * m.inp for m in block_matmuls(p))


def norm_parameters(p: Problem) -> int:
    return (2 if p.arch.norm == "layernorm" else 1) * p.width


def block_bias_parameters(p: Problem) -> int:
    a, kv = p.arch, p.kv_head_count * p.head_dim
    biases = 0
    if a.attention_bias != "none":
        biases += p.attention_width + 2 * kv + (p.width if a.attention_bias == "qkvo" else 0)
    if a.mlp_bias:
        biases += (2 if a.gated else 1) * a.intermediate_size + p.width
    return biases


def block_parameters_of(p: Problem) -> int:
    """All parameters of one block: matmul weights, biases and its two norms."""
    qk_norms = 2 * p.head_dim if p.arch.qk_norm else 0
    return block_matmul_parameters(p) + block_bias_parameters(p) + 2 * norm_parameters(p) + qk_norms


def end_parameters(p: Problem) -> int:
    """The model's ends: the embedding V·E, an untied head V·E, the final norm."""
    head = p.vocab_size * p.width
    return head * (1 if p.arch.tie_word_embeddings else 2) + norm_parameters(p)


def check_layer_target(p: Problem) -> None:
    """A layer or model problem can be built (dattn's block) or planned (a named architecture); normalises its
    sizes: LongNetLM's D = E / H and E = H·D; a layer is one block; a language model is causal."""
    from ..kernels.registry import names

    spec = p.spec
    if p.architecture is not None:
        _check_named(p)
    elif spec.kind != "multihead" or spec.baseline:
        raise ValueError(
            f"--target {p.target} builds layers around a multihead attention; {p.impl} is not "
            f"one: use {', '.join(names(lambda s: s.kind == 'multihead'))}"
        )
    if p.world_size > 1:
        raise ValueError(f"--target {p.target} runs on one device: drop --world-size")
    if p.architecture is None:
        if p.embed_dim is not None:
            if p.embed_dim % p.heads:
                raise ValueError(f"--embed-dim {p.embed_dim} is not divisible by --heads {p.heads}")
            p.head_dim = p.embed_dim // p.heads
    if p.head_dim % 2:
        raise ValueError(f"head dim {p.head_dim} must be even (rotary embeddings): change --embed-dim or --heads")
    if p.architecture is None:
        p.embed_dim = p.heads * p.head_dim
    if p.target == "model":
        p.causal = True  # a language model is causal
    else:
        p.layers = 1


def _check_named(p: Problem) -> None:
    """A transformers decoder layer: its own q/k/v/o projections around a core attention the planner models."""
    from ..kernels.registry import names

    spec, name = p.spec, p.architecture.name
    if spec.kind != "core" or spec.memory_model is None:
        usable = names(lambda s: s.kind == "core" and s.memory_model is not None and s.strategy != "reference")
        raise ValueError(
            f"--impl {p.impl}: a {name} block has its own q/k/v/o projections around the attention; give a core "
            f"attention: {', '.join(usable)}"
        )
    if p.embed_dim is None:
        raise ValueError(f"{name}: the model's width (hidden_size, --embed-dim) is missing")
