"""Memory and time of a DilatedTransformerBlock (`--target layer`) and a LongNetLM training step
(`--target model`: forward, loss, backward, AdamW step), from what autograd keeps and frees.

Sizes: T = batch·N tokens, E the width, F = mlp_ratio·E, H heads of D = E/H, V the vocabulary, L the depth;
p = bytes of the parameter dtype (the residual stream), c = bytes of the compute dtype (autocast's, else p).

Saved for backward by one pre-norm block (counted with torch.autograd.graph.saved_tensors_hooks on the
block of models/longnet.py; tests/plan/test_layers.py checks the sum against measure.LiveTensorBytes):
* the two LayerNorm inputs, 2·T·E·p (LayerNorm runs in fp32 under autocast, on the residual stream)
* the three linear inputs (qkv, out-projection, fc1), 3·T·E·c; the packed q/k/v projection, 3·T·E·c;
  the rotated q and k, 2·T·E·c; fc1's output and GELU's output, 2·T·F·c
* small: lse T·H·4, LayerNorm statistics 16·T, rotary cos/sin tables 8·N·D
* under autocast: the half copies of the linear weights, (4E² + 2EF)·c; the attention core's fp32
  accumulator (plan/memory.py's item), kept with its output
With checkpointing a block keeps only its input, T·E·p; its saved set exists again while it is recomputed
(torch's non-reentrant checkpoint stops recomputing at the last saved tensor, so not its output).
The attention core's scratch (kept-row buffers of the memory pool, its backward gradients) comes from the
attention model of plan/memory.py, in the compute dtype.

The peak is the largest of these phases (the breakdown printed is the peak phase's):
* forward end / backward start: everything saved, plus (model) the loss: log-softmax output, its gradient
  and the gradient of the logits, 3 x T·V fp32 (12·T·V bytes) — at long N with a large vocabulary this,
  not attention, is the largest item; plan --loss chunked holds one chunk of the logits instead (plan/loss.py)
* a block's backward: the first op of the MLP's backward holds the upstream gradient (T·E·p, and its half
  copy), fc2's input gradient T·F·c and weight gradient E·F·c on top of the saved set; with
  checkpointing, the recomputed block's saved set and its output
* (model) the backward's end: every gradient made, the first block's saved set and its attention backward
* (model) the AdamW step: weights, gradients and both moments (4·P·p) plus one temporary of the largest
  parameter's size (torch's foreach AdamW, measured)
AdamW's moments exist from the first step on; gradients are freed by zero_grad(set_to_none=True) between
steps (model). A layer bench accumulates parameter gradients over its calls, so they are always there.
Time: the attention's FLOPs at the attention efficiency (plan/time.py) plus the linear layers' FLOPs,
2·T·(4E² + 2EF) per block (and 2·T·E·V for the head), x3 with backward (workload/counts.py), at the profile's fitted
`matmul:<dtype>/<mode>` efficiency (falls back to the attention prior; --fp8: plan/fp8.py); checkpointing adds
the recomputed forward (x4/3 linear, x4.5/3.5 attention) to the time, not to the FLOPs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..workload.architecture import block_parameters_of, end_parameters
from ..workload.counts import linear_flops, shard_of
from ..workload.problem import ELEMENT_BYTES, Problem
from . import context, decoder, fp8
from .loss import Loss, loss_items
from .memory import MemoryBreakdown, estimate_memory
from .offload import DEVICE_CHECKPOINTS
from .profiles import HardwareProfile
from .recompute import kept_outputs, recomputed_linear_flops
from .time import TimeBreakdown, estimate_time

# CPU host only (a CUDA bench reports the caching allocator's figure, which sees neither): first-call runtime
# costs beyond the profile's framework figures, MiB: the block's kernels (LayerNorm, GELU, matmuls), autocast's,
# the first non-reentrant checkpoint, a model's embedding/loss/AdamW code. Fitted on this project's CPU host (torch
# 2.13, glibc, bench's RSS method) by benchmarks/layer_fit.py over 36 rows (E=256, N=1K..16K, every option); a
# kernel-scratch term in proportion to the activations, fitted alongside, came out at 1.4% of them: none here.
CPU_RUNTIME_MIB = {"block": 15, "autocast": 23, "checkpointing": 38, "model": 28}


@dataclass(frozen=True)
class StepOptions:
    """A model step beyond the Problem: --loss (plan/loss.py), --recompute selective (plan/recompute.py)."""

    loss: Loss = "standard"
    selective: bool = False
    offload_activations: bool = False  # plan/offload.py: the checkpointed inputs in host memory
    tensor_parallel: int = 1  # plan/tensor.py: the weight-shaped transients divided by T

    def recomputing(self, s: Problem) -> bool:
        return s.checkpointing or self.selective


class LayerMemory(MemoryBreakdown):
    phase: str  # which phase of the step the peak (and this breakdown) belongs to


@dataclass
class ModelStates:
    """Per-device bytes of the weights, gradients and optimizer, by the phases they are alive in. The default
    (`bench_states`) is what a dattn bench point holds; plan/parallel.py builds them for data parallel, ZeRO
    and the optimizer choice."""

    resident: dict[str, int]  # every phase: weights (or their shard), optimizer states, persistent buffers
    step: dict[str, int] = field(default_factory=dict)  # the optimizer step adds: gradients, temporaries
    backward: dict[str, int] = field(default_factory=dict)  # a block's backward adds (gradients so far, buckets)
    forward: dict[str, int] = field(default_factory=dict)  # forward, loss and backward add (FSDP gathered units)
    step_name: str = "AdamW step"
    host: dict[str, int] = field(default_factory=dict)  # per device, in host memory (plan/offload.py)


def bench_states(s: Problem) -> ModelStates:
    """What a bench point of `s` holds: weights in --dtype; a layer bench's gradients accumulate over its calls;
    a model step's torch.optim.AdamW keeps two moments in the weight dtype, the gradients exist from the
    backward to zero_grad, and its foreach step takes one temporary of the largest parameter (measured)."""
    p, params = ELEMENT_BYTES[s.dtype], model_parameters(s)
    train = s.mode == "fwdbwd"
    resident = {"weights": params * p}
    if s.target != "model":
        return ModelStates({**resident, "parameter gradients": params * p} if train else resident)
    if not train:
        return ModelStates(resident)
    # torch's AdamW: the for-loop step on CPU holds one temporary of the largest parameter (measured); the foreach
    # step, its default on CUDA, a tensor list of all ("~ sizeof(params) more peak memory", torch/optim/optimizer.py)
    largest = params if s.device.startswith("cuda") else max(s.vocab_size * s.width, s.width * s.hidden)
    return ModelStates(
        {**resident, "AdamW moments": 2 * params * p},
        step={"parameter gradients": params * p, "optimizer temporary": largest * p},
        backward={"embedding/head gradient": s.vocab_size * s.width * p},
    )


def attention_call(s: Problem, sequence_parallel: int = 1) -> Problem:
    """One block's attention call, its sequence sharded over `sequence_parallel` devices (a distributed impl, or
    a dense one split by s.sp_kind: plan/context.py)."""
    attention = s.attention_problem()
    if sequence_parallel > 1 and attention.spec.strategy == "dense":
        attention = context.dense_context(attention, s.sp_kind)
    return attention.model_copy(update={"world_size": sequence_parallel}) if sequence_parallel > 1 else attention


def local_part(s: Problem, sequence_parallel: int = 1) -> Problem:
    """The positions one device holds: N, or the sequence shard L of the attention's layout."""
    sharded = sequence_parallel > 1
    return s.model_copy(update={"seq_len": shard_of(attention_call(s, sequence_parallel))}) if sharded else s


class _Phase:
    def __init__(self, name: str, common: dict[str, int]):
        self.name = name
        self.items = dict(common)

    def add(self, name: str, nbytes: float) -> _Phase:
        if nbytes:
            self.items[name] = self.items.get(name, 0) + int(nbytes)
        return self

    def update(self, items: dict[str, int]) -> _Phase:
        for name, nbytes in items.items():
            self.add(name, nbytes)
        return self

    @property
    def total(self) -> int:
        return sum(self.items.values())


def model_parameters(s: Problem) -> int:
    """Every block's parameters, and a model's embedding, untied head and final norm (workload/architecture.py)."""
    return s.layers * block_parameters_of(s) + (end_parameters(s) if s.target == "model" else 0)


def block_saved_bytes(s: Problem, attention: dict[str, int], tp: int = 1) -> dict[str, int]:
    """What one block keeps for its backward, itemised (module docstring); `attention`: the items of its attention
    call's model (plan/memory.py); a named architecture's: plan/decoder.py (`tp`: weight copies 1/T)."""
    items = decoder.block_saved_bytes(s, attention, tp) if s.architecture is not None else _longnet_saved(s, attention)
    if attention.get(KEPT_COMM):
        items[KEPT_COMM] = attention[KEPT_COMM]
    return items


def _longnet_saved(s: Problem, attention: dict[str, int]) -> dict[str, int]:
    p, c = ELEMENT_BYTES[s.dtype], ELEMENT_BYTES[s.compute_dtype]
    tokens, width, hidden = s.batch * s.seq_len, s.width, s.hidden
    items = {
        "LayerNorm inputs": 2 * tokens * width * p,
        # k, v and rotated k at the kv heads' width (GQA; = width without)
        "linear inputs, q/k/v, rotated q/k": (5 * width + 3 * s.kv_head_count * s.head_dim) * tokens * c,
        "MLP hidden (fc1 and GELU outputs)": 2 * tokens * hidden * c,
        "lse, LayerNorm statistics, rotary tables": tokens * s.heads * 4 + 16 * tokens + 8 * s.seq_len * s.head_dim,
    }
    if c != p:
        kv = s.kv_head_count * s.head_dim
        items["autocast weight copies"] = (2 * width * width + 2 * width * kv + 2 * width * hidden) * c
    items["attention accumulator"] = attention.get("fp32 accumulator", 0)
    return items


def layer_memory(
    s: Problem,
    framework_bytes: int = 0,
    device_type: str = "cpu",
    states: ModelStates | None = None,
    sequence_parallel: int = 1,
    options: StepOptions = StepOptions(),
) -> LayerMemory:
    """Peak bytes of one bench point of --target layer|model, itemised for the phase that peaks; `states`: the
    weights, gradients and optimizer per device (default: a bench point's), `sequence_parallel`: devices
    sharing each sequence (each holds L positions, the attention's own items from plan/memory.py)."""
    call = attention_call(s, sequence_parallel)
    s = local_part(s, sequence_parallel)
    p = ELEMENT_BYTES[s.dtype]
    tokens, width = s.batch * s.seq_len, s.width
    train = s.mode == "fwdbwd"
    attention = context.attention_items(call, device_type)
    if sequence_parallel > 1 and train:
        attention[KEPT_COMM] = _kept_for_backward(call, device_type)
    pool = attention.get("gather buffers (memory pool)", 0)
    model = s.target == "model"
    states = states or bench_states(s)

    common = dict(states.resident)
    if model:
        common["tokens"] = 16 * tokens
    else:
        common["input and output"] = 2 * tokens * width * p
    if pool:
        common["attention kept-row buffers (memory pool)"] = pool
    if s.architecture is not None:
        common["rotary cos/sin (shared by the blocks)"] = decoder.rotary_tables(s)

    phases = (_training_phases if train else _forward_phases)(s, common, attention, states, options)
    peak = max(phases, key=lambda ph: ph.total)
    if device_type == "cpu":
        used = {"block": True, "autocast": s.amp, "checkpointing": options.recomputing(s) and train, "model": model}
        runtime = [name for name, on in used.items() if on]
        peak.add("CPU runtime (" + ", ".join(runtime) + ")", sum(CPU_RUNTIME_MIB[o] for o in runtime) * 2**20)
    if framework_bytes:
        peak.add("framework", framework_bytes)
    return LayerMemory(items=peak.items, total=peak.total, phase=peak.name)


KEPT_COMM = "sequence-parallel K/V kept for backward"


def _kept_for_backward(call: Problem, device_type: str) -> int:
    """What a sequence-parallel attention keeps per block until its backward: the all-gather form its gathered K/V
    rows (the forward's comm buffers), head-parallel its head-shard q, k, v, out; the ring nothing (it re-rotates)."""
    if call.strategy == "allgather":
        return estimate_memory(call.model_copy(update={"mode": "fwd"}), 0, device_type).items.get("comm buffers", 0)
    if call.strategy == "head_parallel":
        return context.attention_items(call, device_type).get("head-shard q, k, v, out", 0)
    return 0


def _forward_phases(
    s: Problem, common: dict[str, int], attention: dict[str, int], states: ModelStates, options: StepOptions
) -> list[_Phase]:
    p, c = ELEMENT_BYTES[s.dtype], ELEMENT_BYTES[s.compute_dtype]
    tokens, width, hidden = s.batch * s.seq_len, s.width, s.hidden
    core = sum(
        v
        for k, v in attention.items()
        if k not in ("inputs q, k, v", "output", "gather buffers (memory pool)", "kernel workspace")
    )
    # one block at a time: the residual, then the larger of the attention half (LN output, packed q/k/v,
    # rotated q/k, the core's scratch and output) and the MLP half (fc1 and GELU outputs)
    attention_half = 6 * tokens * width * c + core + tokens * width * c
    mlp_half = tokens * width * c + (3 if s.arch.gated else 2) * tokens * hidden * c
    phases = [
        _Phase("forward (no grad): a block", common).add(
            "one block's transients", tokens * width * p + max(attention_half, mlp_half)
        )
    ]
    if s.target == "model":
        head = _Phase("forward (no grad): loss", common).add("final LayerNorm output", tokens * width * c)
        phases.append(head.update(loss_items(s, options.loss, train=False)))
    for phase in phases:
        phase.update(states.forward)
    return phases


CORE_BACKWARD_ITEMS = (  # the attention items alive during its backward: the core's gradients and scratch
    "gradients (upstream, dq, dk, dv)",
    "block result",
    "merge copies",
    "index tensors",
    "gather buffers",
    "comm buffers",
    "all-to-all copies",
    "head-shard q, k, v, out",
    "kernel workspace",
)


def _kept(s: Problem, phase: _Phase, current: int | None, residual: int, saved: int, options: StepOptions) -> _Phase:
    """The blocks' saved state while block `current` (its saved bytes; None: no block yet) runs its backward:
    all blocks' saved sets (`saved` each), or with checkpointing their inputs and the recomputed one's (selective
    recompute: and each waiting block's kept outputs)."""
    if options.recomputing(s):
        if s.target == "model":
            name = "checkpointed block inputs" + " (others offloaded)" * options.offload_activations
            phase.add(name, (min(s.layers, DEVICE_CHECKPOINTS) if options.offload_activations else s.layers) * residual)
            if options.selective:
                waiting = s.layers - (current is not None)
                phase.update({f"{k} (selective, {waiting} blocks)": waiting * v for k, v in kept_outputs(s).items()})
        if current is not None:
            phase.add("recomputed block: saved for backward", current)
    elif current is None:
        phase.add("saved for backward (all blocks)", s.layers * saved)
    else:
        phase.add("saved for backward (other blocks)", (s.layers - 1) * saved)
        phase.add("saved for backward (this block)", current)
    return phase


def _loss_phases(s: Problem, common: dict, states: ModelStates, residual: int, saved: int, how: StepOptions):
    """A model's loss backward (the logits' gradient) and its optimizer step."""
    c = ELEMENT_BYTES[s.compute_dtype]
    tokens, width = s.batch * s.seq_len, s.width
    loss = _kept(s, _Phase("loss backward (logits)", common), None, residual, saved, how).update(states.forward)
    if s.architecture is None:
        loss.add("final LayerNorm input and output", residual + tokens * width * c)
    else:
        loss.add("final norm: " + decoder.NORM_ITEM, decoder.norm_saved(s))
    if c != ELEMENT_BYTES[s.dtype]:
        tied = "tied" if s.arch.tie_word_embeddings else "untied"
        loss.add(f"autocast copy of the {tied} head weight", s.vocab_size * width * c // how.tensor_parallel)
    loss.update(loss_items(s, how.loss, train=True, tp=how.tensor_parallel))
    return [loss, _Phase(states.step_name, common).update(states.step)]


def _training_phases(
    s: Problem, common: dict[str, int], attention: dict[str, int], states: ModelStates, options: StepOptions
) -> list[_Phase]:
    p, c = ELEMENT_BYTES[s.dtype], ELEMENT_BYTES[s.compute_dtype]
    tokens, width, hidden = s.batch * s.seq_len, s.width, s.hidden
    residual = tokens * width * p
    saved = sum(block_saved_bytes(s, attention, options.tensor_parallel).values())
    model = s.target == "model"
    upstream = residual + (tokens * width * c if c != p else 0)
    mlp_backward = decoder.mlp_backward(s, options.tensor_parallel)  # LongNet's GELU MLP: the same form
    phases = _loss_phases(s, common, states, residual, saved, options) if model else []
    name = "last block's backward (MLP)" if model else "block backward (MLP)"
    block = _kept(s, _Phase(name, common), saved, residual, saved, options)
    block.update(states.forward).update(states.backward)
    block.add("upstream gradient, fc2 input and weight gradients", upstream + mlp_backward)
    phases.append(block)
    # the attention's backward: the MLP half of the block's saved set is gone; the core's gradients and scratch (and a
    # sequence-parallel form's buffers, less what it kept: in the saved set) and the packed q/k/v gradient appear
    mlp_half = 2 * tokens * hidden * c + tokens * width * (c + p) if s.architecture is None else decoder.mlp_half(s)
    attention_half = saved - mlp_half
    core_backward = sum(v for k, v in attention.items() if k in CORE_BACKWARD_ITEMS) - attention.get(KEPT_COMM, 0)
    name = "last block's backward (attention)" if model else "block backward (attention)"
    att = _kept(s, _Phase(name, common), attention_half, residual, saved, options)
    att.update(states.forward).update(states.backward)
    packed_qkv = (s.attention_width + 2 * s.kv_head_count * s.head_dim) * tokens * c  # q/k/v projections' gradients
    transients = 2 * residual + packed_qkv + core_backward
    att.add("residual gradients, packed dq/dk/dv, attention gradients and scratch", transients)
    phases.append(att)
    if model:  # the backward's end: every gradient made, only the first block's saved set left
        first = _Phase("first block's backward (attention), every gradient made", common).update(states.forward)
        recomputing = options.recomputing(s)
        first.add(
            "recomputed block: saved for backward" if recomputing else "saved for backward (this block)",
            attention_half + (residual if recomputing else 0),
        )
        first.update({k: v for k, v in states.step.items() if "gradients" in k})
        first.update({k: v for k, v in states.backward.items() if not k.startswith("embedding/head gradient")})
        phases.append(first.add("residual gradients, packed dq/dk/dv, attention gradients and scratch", transients))
    return phases


def recompute_factors(s: Problem, selective: bool = False) -> tuple[float, float]:
    """(attention, linear) work executed per unit of useful work: checkpointing runs each block's forward
    again, +1 of 3.5 for the attention (fwd+bwd = 3.5 x fwd) and +1 of 3 for the linear layers; selective
    recompute only the matmuls it does not keep (plan/recompute.py); a tiled MLP its forward (plan/decoder.py)."""
    if s.mode != "fwdbwd":
        return 1.0, 1.0
    tiled = s.layers * decoder.mlp_forward_flops(s) / linear_flops(s) if s.arch.tiled_mlp else 0.0
    if s.checkpointing:
        return 4.5 / 3.5, 4 / 3 + tiled
    if selective:
        return 1.0, 1 + s.layers * recomputed_linear_flops(s) / linear_flops(s) + tiled
    return 1.0, 1.0 + tiled


def matmul_key(s: Problem) -> str:
    """The profile's per_impl key of the linear layers' efficiency (fitted by `plan --calibrate`)."""
    return f"matmul:{s.compute_dtype}"


def linear_seconds(s: Problem, profile: HardwareProfile, flops: float) -> float:
    """The linear layers' FLOPs at the compute dtype's peak x the matmul efficiency (--fp8: plan/fp8.py)."""
    if fp8.kind(s) is not None:
        return fp8.linear_seconds(s, profile, flops, lambda key: profile.efficiency.compute_for(key, s.mode))
    peak = profile.required_peak(s.compute_dtype, "pick another --dtype or --amp")
    return flops / (peak * profile.efficiency.compute_for(matmul_key(s), s.mode))


def attention_part(s: Problem, profile: HardwareProfile) -> tuple[float, float]:
    """(useful FLOPs, seconds) of all the blocks' attention calls at the attention efficiency, the
    checkpoint recompute included in the seconds."""
    attention = estimate_time(s.attention_problem(), profile)
    return attention.flops * s.layers, attention.compute_s * s.layers * recompute_factors(s)[0]


def estimate_layer_time(s: Problem, profile: HardwareProfile) -> TimeBreakdown:
    """Compute time of one bench point: the attention calls at the attention efficiency, the linear layers
    at the matmul efficiency (no communication: layer and model targets run on one device)."""
    attention_flops, attention_s = attention_part(s, profile)
    useful_linear = linear_flops(s)
    linear_s = linear_seconds(s, profile, useful_linear * recompute_factors(s)[1])
    compute = attention_s + linear_s
    return TimeBreakdown(
        flops=attention_flops + useful_linear,
        compute_s=compute,
        total_s=compute,
        link="none",
        note=f"attention {attention_s * 1e3:.1f} ms + linear layers {linear_s * 1e3:.1f} ms",
    )
