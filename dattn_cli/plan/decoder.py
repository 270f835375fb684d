"""What a Hugging Face transformers decoder layer (Llama, Mistral, Qwen2: workload/architecture.py) keeps for its
backward, and the transients of its backward, for plan/layers.py's phases.

Sizes as in plan/layers.py: T tokens, E the width, H·D the attention width, K = H_kv·D, F the intermediate size,
p the bytes of the weight (residual stream) dtype, c of the compute dtype (autocast's, else p). Counted from what
autograd saves in transformers/models/llama/modeling_llama.py and its Mistral and Qwen2 copies (transformers 5.x,
sdpa attention), and checked to the byte against LlamaDecoderLayer, MistralDecoderLayer and Qwen2DecoderLayer
(tests/plan/test_decoder.py):
* each RMSNorm (`hidden.to(float32)`, `pow`, `rsqrt`, `weight * normalized.to(input dtype)`): its input in fp32,
  T·E·4 (a copy unless the stream is fp32, then the input itself), the normalized tensor in the stream's dtype
  T·E·p, its output T·E·c (the next linears' input) and the rsqrt, T·4. Under autocast the fp32 output is not
  kept but each linear it feeds keeps its own half copy (autocast caches the casts of weights, not of
  activations): q, k and v three, a gated MLP's gate and up two. A LayerNorm keeps its input T·E·p, its
  output and mean and rstd, 8·T. With `--fused-norm` (Liger's LigerRMSNorm, TransformerEngine's RMSNorm, apex or a
  compiled norm: one kernel that saves its input and the per-token rstd) an RMSNorm keeps T·E·p, its output and
  T·4: no fp32 copy, no normalized tensor.
* qwen3's q_norm and k_norm (RMSNorm over each head's D): as a norm of width H·D + K, before the rotary; their
  outputs feed only the rotary, which keeps none of them.
* the attention: the rotated q (T·H·D·c), the rotated k and the v projection (T·K·c each) and the core's output
  (T·H·D·c, also o_proj's input) and lse: the core's inputs and output in plan/memory.py's model. Rotary's
  `q * cos` keeps cos and sin, not q: the un-rotated q and k are not kept. Biases keep nothing.
* the MLP: gated, the gate and up outputs, the activation's output and the product that feeds down, 4·T·F·c;
  plain GELU, fc1's output and GELU's, 2·T·F·c.
* under autocast, the half copies of the linear weights (block_matmul_parameters x c).
* rotary cos and sin, 2·N·D·p, once per model (every block reads the same tables).
With `--tiled-mlp` (ALST's TiledMLP, DeepSpeed's module `deepspeed.runtime.sequence_parallel.ulysses_sp`: the MLP in
S = ceil(N / E) sequence shards, "num_shards = math.ceil(seqlen / hidden)" in its example) the MLP keeps only its
input (the norm's output, already counted: one consumer), and its backward holds the input's gradient T·E·c, made
whole, and one shard's recomputed MLP tensors and backward transients; the MLP's forward runs twice.
"""

from __future__ import annotations

from ..workload.architecture import block_matmul_parameters
from ..workload.problem import ELEMENT_BYTES, Problem
from . import fp8

NORM_ITEM = "norm inputs (fp32), normalized and outputs"


def norm_saved(s: Problem, consumers: int = 1, fp8_linears: bool = False) -> int:
    """One norm's saved tensors (module docstring), its output as kept by the `consumers` linears it feeds (FP8
    linears of a block under --fp8 te: each its own FP8 copy)."""
    p, c = ELEMENT_BYTES[s.dtype], ELEMENT_BYTES[s.compute_dtype]
    tokens = s.batch * s.seq_len
    outputs = (consumers if s.amp else 1) * tokens * s.width * c
    if fp8_linears and fp8.saves_fp8(s):  # each linear its own FP8 copy (plan/fp8.py)
        outputs = consumers * tokens * s.width
    if s.arch.norm == "rmsnorm":
        return tokens * s.width * (p if s.arch.fused_norm else 4 + p) + outputs + 4 * tokens
    return tokens * s.width * p + outputs + 8 * tokens


def qk_norm_saved(s: Problem) -> int:
    """qwen3's q_norm and k_norm (module docstring): their inputs as a norm's, per head a per-token rstd."""
    if not s.arch.qk_norm:
        return 0
    tokens, p = s.batch * s.seq_len, ELEMENT_BYTES[s.dtype]
    width = s.attention_width + s.kv_head_count * s.head_dim
    return tokens * width * (p if s.arch.fused_norm else 4 + p) + 4 * tokens * (s.heads + s.kv_head_count)


def _block_norms(s: Problem) -> tuple[int, int]:
    """(the attention's norm, the MLP's norm): q, k and v read the first, gate and up (or fc1) the second (a tiled
    MLP reads it once)."""
    return norm_saved(s, 3, True), norm_saved(s, 2 if s.arch.gated and not s.arch.tiled_mlp else 1, True)


def mlp_shards(s: Problem) -> int:
    """The tiled MLP's sequence shards, ceil(N / E) (module docstring); 1 untiled."""
    return -(-s.seq_len // s.width) if s.arch.tiled_mlp else 1


def mlp_saved(s: Problem, rows: int | None = None) -> int:
    """The MLP's own saved tensors for `rows` tokens (default all; a tiled MLP keeps none, its input is the norm's)."""
    if rows is None and s.arch.tiled_mlp:
        return 0
    c = ELEMENT_BYTES[s.compute_dtype]
    kept = (4 if s.arch.gated else 2) * c - (c - 1 if fp8.saves_fp8(s) else 0)  # down's input in FP8 (plan/fp8.py)
    return kept * (s.batch * s.seq_len if rows is None else rows) * s.hidden


def block_saved_bytes(s: Problem, attention: dict[str, int], tp: int = 1) -> dict[str, int]:
    """One decoder layer's saved set, itemised; `attention`: plan/memory.py's items of its attention call. Under
    tensor parallelism `s` is one device's token share and the weight copies are 1/T (plan/tensor.py)."""
    c = ELEMENT_BYTES[s.compute_dtype]
    core = sum(attention.get(k, 0) for k in ("inputs q, k, v", "output", "lse"))
    items = {
        NORM_ITEM: sum(_block_norms(s)) + qk_norm_saved(s),
        "rotated q and k, v, attention output and lse": core,
        "MLP: gate, up, activation and product" if s.arch.gated else "MLP hidden (fc1 and GELU outputs)": mlp_saved(s),
    }
    if fp8.saves_fp8(s):  # plan/fp8.py: o_proj's FP8 input, the FP8 weights and transposes (no autocast copies)
        items["FP8 copies: o_proj input, weights and transposes"] = (
            s.batch * s.seq_len * s.attention_width + fp8.weight_copies(s) // tp
        )
    elif c != ELEMENT_BYTES[s.dtype]:
        items["autocast weight copies"] = block_matmul_parameters(s) * c // tp
    items["attention accumulator"] = attention.get("fp32 accumulator", 0)
    return items


def mlp_half(s: Problem) -> int:
    """The MLP half of the saved set (its norm and the MLP's tensors), freed before the attention's backward."""
    return _block_norms(s)[1] + mlp_saved(s)


def mlp_backward(s: Problem, tp: int = 1) -> int:
    """Transients of the MLP's backward beyond the upstream gradient: down's input and weight gradients, and for a
    gated MLP the product's backward, which holds its upstream gradient and the gradients of both factors. Tiled:
    the input's gradient, and one shard's recomputed tensors and these transients. `tp`: tensor parallelism splits
    the weight gradient (the rows are already the device's, plan/tensor.py)."""
    c, tokens = ELEMENT_BYTES[s.compute_dtype], s.batch * s.seq_len
    if s.arch.tiled_mlp:
        rows = -(-tokens // mlp_shards(s))
        return tokens * s.width * c + mlp_saved(s, rows) + _mlp_transients(s, rows)
    return _mlp_transients(s, tokens, tp)


def _mlp_transients(s: Problem, rows: int, tp: int = 1) -> int:
    c, hidden = ELEMENT_BYTES[s.compute_dtype], s.hidden
    down = rows * hidden * c + s.width * hidden * c // tp
    return max(down, 2 * rows * hidden * c) if s.arch.gated else down


def mlp_forward_flops(s: Problem) -> float:
    """One block's MLP forward FLOPs, 2·T·(its weights): what a tiled MLP runs again in the backward."""
    return 2.0 * s.batch * s.seq_len * (3 if s.arch.gated else 2) * s.width * s.hidden


def rotary_tables(s: Problem) -> int:
    """cos and sin of the positions, in the stream's dtype, made once per forward and read by every block."""
    return 2 * s.seq_len * s.head_dim * ELEMENT_BYTES[s.dtype]
