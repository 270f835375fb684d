"""Memory model of a DilatedTransformerBlock and a LongNetLM training step (bench --target layer|model).

Status: a first model, not yet calibrated. Its first check (CPU, fp32, one block, E=256, H=4, fwd+bwd,
N=2k/4k) predicted 129/198 MiB against 157/258 MiB measured (-18%/-24%): the backward transients of the
block are under-counted. `plan --target` and the +-15% check of the layer issue are still open.

Per block, with T = batch x N tokens, E the width, F = mlp_ratio x E, s the bytes of the compute dtype:

* saved for backward without checkpointing: the tensors autograd keeps — LayerNorm inputs and outputs
  (4·T·E), q, k, v and their rotary copies (5·T·E), the attention output and the sub-LayerNorm/out-proj
  input (2·T·E), the MLP's fc1 output and GELU output (2·T·F) — plus the attention core's own saved
  state (its fp32 output accumulator and lse: 4·T·E + 4·T·H bytes);
* with checkpointing: only the block input (T·E) per block, plus one block's saved set while it is
  recomputed during backward;
* transient peak inside a block: the attention workspace of plan/memory.py's model for the core.

A model adds the embedding/head (V·E), weights + gradients + AdamW's two moments (4 x parameters, in the
parameter dtype), and the logits: T·V in the compute dtype plus the fp32 copy the loss takes and its
gradient (2·T·V·4 bytes) — at long sequences with a large vocabulary the logits, not attention, dominate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass
class LayerMemory:
    items: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, nbytes: float) -> None:
        self.items[name] = self.items.get(name, 0) + int(nbytes)

    @property
    def total(self) -> int:
        return sum(self.items.values())


def block_parameters(width: int, mlp_ratio: float, subln: bool = False) -> int:
    hidden = int(width * mlp_ratio)
    params = 4 * width * width + 4 * width + 2 * width * hidden + hidden + width + 4 * width  # attn, mlp, two LNs
    if subln:
        params += 2 * width + 2 * hidden
    return params


def layer_memory(cfg, seq_len: int) -> LayerMemory:
    """Peak bytes of one bench point of --target layer|model (cfg: a BenchConfig)."""
    from .memory import Shape, estimate_memory

    if cfg.target not in ("layer", "model"):
        raise ValueError(f"layer_memory models --target layer or model, not {cfg.target!r}")
    param_bytes = DTYPE_BYTES[cfg.dtype]
    compute_dtype = {"bf16": "bfloat16", "fp16": "float16"}[cfg.amp] if cfg.amp else cfg.dtype
    compute = DTYPE_BYTES[compute_dtype]
    tokens, width = cfg.batch * seq_len, cfg.width
    hidden = int(width * cfg.mlp_ratio)
    layers = cfg.layers if cfg.target == "model" else 1
    train = cfg.mode == "fwdbwd"
    # the attention core: its own model (inputs, outputs, kept-row buffers, gradients), plan/memory.py
    attention = estimate_memory(Shape(
        impl=cfg.impls[0], seq_len=seq_len, batch=cfg.batch, heads=cfg.heads, head_dim=cfg.head_dim,
        segment_lengths=cfg.segment_lengths, dilation_rates=cfg.dilation_rates, semantics=cfg.semantics,
        causal=cfg.causal, dtype=compute_dtype, mode=cfg.mode), 0, "cuda" if cfg.device.startswith("cuda") else "cpu").total
    # around it, autograd keeps: LN input and output, the residual, the second LN's output (4 x T·E),
    # the out-projection input (T·E), fc1's and GELU's outputs (2 x T·F)
    saved_around = (5 * width + 2 * hidden) * tokens * compute
    memory = LayerMemory()
    params = layers * block_parameters(width, cfg.mlp_ratio) + (cfg.vocab_size * width + 2 * width if cfg.target == "model" else 0)
    memory.add("weights", params * param_bytes)
    if cfg.target == "layer":
        memory.add("input", tokens * width * param_bytes * (2 if train else 1))
    else:
        memory.add("tokens", tokens * 16)
        memory.add("logits", tokens * cfg.vocab_size * (compute + (8 if train else 4)))
    if not train:
        memory.add("one block's transients", attention + 2 * hidden * tokens * compute)
        return memory
    memory.add("gradients", params * param_bytes)
    if cfg.target == "model":
        memory.add("AdamW moments", 2 * params * param_bytes)
    if cfg.checkpointing:
        memory.add("checkpointed block inputs", layers * tokens * width * compute)
        memory.add("one block recomputed (attention + saved around it)", attention + saved_around)
    else:
        memory.add("attention (saved, per block)", layers * attention)
        memory.add("saved around attention (per block)", layers * saved_around)
    memory.add("backward transients", 2 * hidden * tokens * compute)
    return memory
