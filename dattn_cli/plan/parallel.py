"""Whole-model training plans across devices (`plan --target model --devices N`): data parallel (DDP),
ZeRO stages 1-3 / FSDP, sequence parallel attention, tensor parallelism (plan/tensor.py) and their product, the
optimizer's states, and the gradient and parameter collectives with their overlap (plan/collectives.py;
docs/plan.md, "Whole-model plans across devices").

Layout: N devices = dp x sp x tp, tensor parallel innermost. A data-parallel replica of sp x tp devices shares each
of its --batch sequences, each device holding L = N/sp positions (the attention's shard rule,
registry.shard_length) and 1/tp of each block's weights; the dp x sp devices holding the same tensor shard hold the
same weights, so ZeRO shards over them (sequence-parallel ranks share the shards, as DeepSpeed-Ulysses does) and
gradients are reduced over them. Below, N counts those devices.

Model states per device, P parameters, p bytes per weight (--dtype), Ψ as in the ZeRO paper
(Rajbhandari et al. 2020, arXiv:1910.02054, §3.1: mixed-precision Adam holds 2Ψ + 2Ψ + 12Ψ):
* parameters P·p, /N with ZeRO-3; gradients P·p (in the weight dtype, as autograd makes them), /N with
  ZeRO-2 and 3; optimizer states and the fp32 master copy, /N with ZeRO >= 1 (OPTIMIZERS)
* DDP's buckets: torch DDP copies gradients into its all-reduce buckets unless gradient_as_bucket_view=True
  ("the saved memory size will be equal to the total gradients size", torch.nn.parallel.DistributedDataParallel
  docs): P·p more, allocated when DDP is built
* ZeRO-3/FSDP: the unit in use and the prefetched one all-gathered (p bytes): max(2 blocks, head + block);
  ZeRO-2/3: the unsharded gradient of the unit being reduce-scattered
Collectives (plan/collectives.py): DDP: one all-reduce of the gradients; ZeRO-1/2:
a reduce-scatter of the gradients and an all-gather of the updated parameters; ZeRO-3: all-gathers in the
forward and in the backward and a reduce-scatter of the gradients (3Ψ against DDP's 2Ψ, ZeRO paper §7.2).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

from ..kernels.registry import names
from ..workload.architecture import block_parameters_of
from ..workload.counts import linear_flops
from ..workload.problem import ELEMENT_BYTES, SIZE_LIMITS, Problem
from . import context, fp8, nccl, offload as host, tensor
from .collectives import Collective, Group, Sharded, data_parallel, replicate_all_reduce, tensor_parallel
from .layers import (
    LayerMemory,
    ModelStates,
    StepOptions,
    attention_call,
    layer_memory,
    linear_seconds,
    local_part,
    model_parameters,
    recompute_factors,
)
from .loss import Loss
from .memory import framework_bytes
from .profiles import HardwareProfile
from .recompute import Recompute, check as check_recompute
from .time import TimeBreakdown, estimate_time

Optimizer = Literal["adamw", "adam8bit", "sgd", "torch-adamw"]
# bytes per parameter of the optimizer's states, and what they are
OPTIMIZERS: dict[str, tuple[float | None, str]] = {
    "adamw": (8.0, "AdamW: exp_avg and exp_avg_sq in fp32"),
    # bitsandbytes Optimizer2State.init_state: uint8 state1/state2 and one fp32 absmax per 256 values each
    # (bitsandbytes/optim/optimizer.py; block-wise quantization, Dettmers et al. 2022, arXiv:2110.02861)
    "adam8bit": (2 + 2 * 4 / 256, "8-bit Adam: two uint8 states + an fp32 absmax per 256 values each"),
    "sgd": (4.0, "SGD: one fp32 momentum buffer"),
    "torch-adamw": (None, "torch AdamW on the weights as they are: two states in the weight dtype, no master copy"),
}
ZERO_NAMES = {
    0: "DDP (replicated)",
    1: "ZeRO-1 (optimizer states sharded)",
    2: "ZeRO-2 (+ gradients sharded)",
    3: "ZeRO-3 / FSDP full shard (+ parameters sharded)",
}


class Training(BaseModel):
    """How a model's training step is spread over devices and optimised (plan --target model)."""

    devices: int = 1
    sequence_parallel: int = 1
    tensor_parallel: int = 1  # plan/tensor.py
    zero: Literal[0, 1, 2, 3] = 0
    optimizer: Optimizer = "adamw"
    loss: Loss = "standard"  # plan/loss.py
    # plan/recompute.py; None: as the Problem's checkpointing says (full or none); given, it must agree with it
    recompute: Recompute | None = None
    offload: tuple[host.Offload, ...] = ()  # plan/offload.py: what lives in host memory
    global_batch_tokens: int | None = None  # plan/throughput.py: tokens an optimizer step over all replicas
    # HSDP: ZeRO shards over this many of the replicas (consecutive) and the groups hold copies; None: all of them
    dp_shard: int | None = None

    @field_validator("devices", "sequence_parallel", "tensor_parallel")
    @classmethod
    def _count(cls, value: int, info) -> int:
        option = "--" + info.field_name.replace("_", "-")
        if not 1 <= value <= SIZE_LIMITS["world_size"]:
            raise ValueError(f"{option} must be from 1 to {SIZE_LIMITS['world_size']:,}, got {value:,}")
        return value

    @model_validator(mode="after")
    def _layout(self) -> Training:
        if self.devices % (self.sequence_parallel * self.tensor_parallel):
            tp = self.tensor_parallel > 1
            raise ValueError(
                f"--sequence-parallel {self.sequence_parallel}"
                + (f" x --tensor-parallel {self.tensor_parallel}" if tp else "")
                + f" does not divide --devices {self.devices}: devices = data parallel x sequence parallel"
                + (" x tensor parallel" if tp else "")
            )
        if self.dp_shard is not None and (self.dp_shard < 1 or self.replicas % self.dp_shard or self.zero == 0):
            raise ValueError(
                f"--dp-shard {self.dp_shard} must divide the {self.replicas} devices that hold the same tensor shard "
                "(dp x sp), with --zero 1, 2 or 3 (it shards the ZeRO states over that many)"
            )
        return self

    @property
    def data_parallel(self) -> int:
        return self.devices // (self.sequence_parallel * self.tensor_parallel)

    @property
    def replicas(self) -> int:
        """The devices holding the same tensor-parallel shard (dp x sp)."""
        return self.devices // self.tensor_parallel

    @property
    def shards(self) -> int:
        """The devices ZeRO shards over: every replica, or --dp-shard of them (HSDP)."""
        return self.dp_shard or self.replicas

    def describe(self) -> str:
        tp = f" x tp {self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return (
            f"{self.devices} devices = dp {self.data_parallel} x sp {self.sequence_parallel}{tp}; "
            f"{ZERO_NAMES[self.zero] if self.devices > 1 else 'one device'}"
            + (
                f" over {self.shards}, {self.replicas // self.shards} copies (HSDP)"
                if self.shards < self.replicas
                else ""
            )
            + f"; {OPTIMIZERS[self.optimizer][1]}"
            + ("; chunked loss (no full logits)" if self.loss == "chunked" else "")
            + ("; selective recompute (matmul and attention outputs kept)" if self.recompute == "selective" else "")
            + (f"; offloaded to the host: {', '.join(self.offload)}" if self.offload else "")
        )


def check_impl(s: Problem, t: Training) -> None:
    """A sequence-parallel layout needs a distributed attention or a dense one split by --sp-kind (plan/context.py),
    a tensor-parallel one a named model's dense block (plan/tensor.py) (bad input: the CLI exits 2)."""
    tensor.check(s, t.tensor_parallel, t.sequence_parallel)
    context.check(s, t.sequence_parallel)
    if t.sequence_parallel > 1 and not s.spec.distributed and s.spec.strategy != "dense":
        raise ValueError(
            f"--sequence-parallel {t.sequence_parallel} needs a distributed multihead --impl, not "
            f"{s.impl}: use " + ", ".join(names(lambda x: x.distributed and x.kind == "multihead"))
        )


def check_layout(s: Problem, t: Training) -> None:
    """The attention can shard N over the sp devices (else the plan is infeasible, saying why)."""
    sp = t.sequence_parallel
    check_impl(s, t)
    if sp == 1:
        return
    if sp > s.seq_len:
        raise ValueError(f"--sequence-parallel {sp} is more than N={s.seq_len:,}: use fewer devices per sequence")
    if reason := (call := attention_call(s, sp)).spec.shard_rule(call, sp):
        raise ValueError(f"{call.impl} cannot shard N={s.seq_len:,} over --sequence-parallel {sp}: {reason}")


def optimizer_bytes(optimizer: str, weight_bytes: int) -> tuple[float, float]:
    """(state bytes, fp32 master-copy bytes) per parameter. Half weights train against an fp32 master copy
    (mixed precision, whatever the optimizer); fp32 weights (--dtype float32, with or without --amp) are
    their own master. torch-adamw is what dattn bench's model step runs: states in the weight dtype."""
    states, _ = OPTIMIZERS[optimizer]
    if states is None:
        return 2.0 * weight_bytes, 0.0
    return states, 4.0 if weight_bytes < 4 else 0.0


def _units(s: Problem, tp: int = 1) -> tuple[float, float]:
    """(parameters of the largest block, of the embedding/head) on one device: FSDP's wrapping units."""
    return tensor.block_unit(s, block_parameters_of(s), tp)[0], s.vocab_size * s.width / tp


def _gathered(s: Problem, tp: int = 1) -> float:
    """Bytes of a block's parameters on one device in an FSDP all-gather: p each, its matmuls' 1 with torchao's
    float8 all-gather (plan/fp8.py)."""
    block, matmul = tensor.block_unit(s, block_parameters_of(s), tp)
    return (block - matmul) * ELEMENT_BYTES[s.dtype] + matmul * fp8.gathered_matmul_bytes(s)


def device_parameters(s: Problem, t: Training) -> float:
    """The parameters one device holds before ZeRO: tensor parallelism splits all but the norms (plan/tensor.py)."""
    return tensor.device_parameters(s, model_parameters(s), t.tensor_parallel)


def step_temporary(optimizer: str, state_bytes: float, params: float, largest: float, device_type: str) -> float:
    """What torch's AdamW step allocates on top of its states, per device: the for-loop step (torch's choice on CPU)
    one temporary of the largest parameter, the foreach step (its default on CUDA) a tensor list of every one:
    "the foreach implementation uses ~ sizeof(params) more peak memory than the for-loop version"
    (torch/optim/optimizer.py, the foreach argument's doc); one state's bytes per value. SGD's momentum and the
    8-bit step update in place: none."""
    if optimizer in ("sgd", "adam8bit"):
        return 0.0
    return (params if device_type == "cuda" else largest) * state_bytes / 2


def model_states(s: Problem, t: Training, device_type: str = "cuda") -> ModelStates:
    """The weights, gradients and optimizer of one device, by phase (module docstring); `device_type` decides
    torch's AdamW implementation (step_temporary)."""
    p, params, n, z = ELEMENT_BYTES[s.dtype], device_parameters(s, t), t.shards, t.zero
    block, head = _units(s, t.tensor_parallel)
    sharded = n > 1
    resident = {"parameters" + (f" (1/{n} shard)" if z == 3 and sharded else ""): params * p / (n if z == 3 else 1)}
    forward = {}
    if z == 3 and (sharded or "parameters" in t.offload):
        gathered = _gathered(s, t.tensor_parallel)
        forward["all-gathered parameters (unit in use + prefetched)"] = max(2 * gathered, head * p + gathered)
    if s.mode != "fwdbwd":
        return ModelStates(_whole(resident), forward=_whole(forward), step_name="no optimizer step")
    states, master = optimizer_bytes(t.optimizer, p)
    split = n if z >= 1 else 1
    shard = f" (1/{n} shard)" if z >= 1 and sharded else ""
    resident[f"optimizer states{shard}"] = params * states / split
    if master:
        resident[f"fp32 master weights{shard}"] = params * master / split
    if z == 0 and sharded:
        resident["DDP gradient buckets (all-reduce copies)"] = params * p
    backward = {}  # the backward phases hold the forward's items too (plan/layers.py)
    if z >= 2 and sharded:
        backward["unsharded gradient of the unit being reduce-scattered"] = max(block, head) * p
    else:
        backward["embedding/head gradient"] = head * p
    gradients = params * p / (n if z >= 2 else 1)
    temporary = step_temporary(t.optimizer, states, params, max(block, head), device_type)
    step = {
        "gradients" + (f" (1/{n} shard)" if z >= 2 and sharded else ""): gradients,
        "optimizer temporary": temporary / split,
    }
    resident, on_host = host.split(resident, t.offload)
    if "optimizer" in t.offload:  # DeepSpeed's CPU Adam updates in place (no temporary), reading an fp32 gradient
        del step["optimizer temporary"]  # partition in pinned host memory (deepspeed.runtime.zero.stage_1_and_2)
        if z >= 2:  # each reduced gradient bucket is copied to that host partition: no device gradient shard
            step = {}
        on_host[f"{host.HOST_GRADIENTS}{shard}"] = params * 4 / split
    name = "optimizer step" + (" (on the host)" if "optimizer" in t.offload else "")
    return ModelStates(*map(_whole, (resident, step, backward, forward)), name, host=_whole(on_host))


def _whole(items: dict[str, float]) -> dict[str, int]:
    """Bytes are whole: a shard of P parameters over n devices rounds up (P·p/n need not be an integer)."""
    return {k: math.ceil(v) for k, v in items.items()}


def model_memory(s: Problem, profile: HardwareProfile, t: Training, device_type: str) -> LayerMemory:
    """Peak bytes per device of one training step of `s` laid out by `t`, itemised for the peak phase."""
    check_layout(s, t)
    check_recompute(s, t.recompute)
    host.check(s, t, profile.host is not None, profile.name)
    states = model_states(s, t, device_type)
    if device_type == "cuda":
        layout = (t.devices, t.sequence_parallel, t.tensor_parallel)
        per_node = tensor.outer(profile, t.tensor_parallel).devices_per_node
        buffers, name = nccl.buffer_bytes(*layout, attention_call(s, t.sequence_parallel).strategy, per_node)
        states.resident.update({name: buffers} if buffers else {})
    if (tp := t.tensor_parallel) > 1:  # plan/tensor.py: the column-parallel matmuls' all-gathered input
        gathered = s.batch * (s.seq_len // t.sequence_parallel) * s.width * ELEMENT_BYTES[s.compute_dtype]
        states.forward["tensor-parallel all-gathered input"] = gathered  # the backward phases hold it too
    options = StepOptions(t.loss, t.recompute == "selective", "activations" in t.offload, tp)
    mine = tensor.token_share(s, tp)
    return layer_memory(mine, framework_bytes(profile, s.mode), device_type, states, t.sequence_parallel, options)


class StepTime(TimeBreakdown):
    collectives: list[Collective] = []
    optimizer_s: float = 0.0
    attention_s: float = 0.0  # the attention's compute (recomputation included), of compute_s
    exposed_s: float = 0.0  # communication not hidden under compute


def model_time(s: Problem, profile: HardwareProfile, t: Training) -> StepTime:
    """Time per training step per device: compute of the local positions (attention at its sequence-parallel
    layout, linear layers at the matmul efficiency), the attention's exposed communication, the data-parallel
    collectives' exposed part, and the optimizer step at memory bandwidth."""
    sp, tp = t.sequence_parallel, t.tensor_parallel
    call, local = attention_call(tensor.head_share(s, tp), sp), local_part(s, sp)
    attention = estimate_time(call, tensor.outer(profile, tp))
    recompute_attention, recompute_linear = recompute_factors(s, t.recompute == "selective")
    rate = context.split_rate(call)  # a dense attention split by a ring or an all-gather (plan/context.py)
    attention_compute = (attention.compute_s / rate + attention.memory_s) * s.layers * recompute_attention
    sp_exposed = max(0.0, attention.total_s - attention.compute_s - attention.memory_s) * s.layers * recompute_attention
    linear_s = linear_seconds(s, profile, linear_flops(local) / tp * recompute_linear)
    compute = attention_compute + linear_s
    train = s.mode == "fwdbwd"
    forward_s = compute / 3 if train else compute  # linear fwd is 1/3 of fwd+bwd, attention 1/3.5: about a third
    link = profile.link(t.devices)[0]
    collectives = _weight_and_tensor_collectives(s, profile, t, (forward_s, compute - forward_s))
    optimizer_s = _optimizer_seconds(s, profile, t) if train else 0.0
    if t.offload:
        copies, optimizer_s = _host_side(s, profile, t, (forward_s, compute - forward_s), optimizer_s)
        collectives += copies
    comm_bytes = sum(c.bytes for c in collectives) + attention.comm_bytes * s.layers
    comm_s = sum(c.seconds for c in collectives) + attention.comm_s * s.layers * recompute_attention
    exposed = sum(c.exposed_s for c in collectives) + sp_exposed
    if sp > 1:
        collectives.append(
            Collective(
                name=f"attention {call.strategy} (sequence parallel, {s.layers} blocks)",
                bytes=attention.comm_bytes * s.layers,
                seconds=attention.comm_s * s.layers * recompute_attention,
                exposed_s=sp_exposed,
                overlap=attention.note,
                link=attention.link,
            )
        )
    note = (
        f"attention {attention_compute * 1e3:.1f} ms"
        + (f" (split: {rate:.3g} of the kernel's rate, plan/context.py)" if rate < 1 else "")
        + f" + linear layers {linear_s * 1e3:.1f} ms; optimizer step "
        f"{optimizer_s * 1e3:.1f} ms at {'host ' if 'optimizer' in t.offload else ''}memory bandwidth; "
        f"communication exposed {exposed * 1e3:.1f} ms"
    )
    flops = attention.flops * s.layers + linear_flops(local) / tp
    return StepTime(
        flops=flops,
        compute_s=compute,
        comm_bytes=int(comm_bytes),
        messages=attention.messages * s.layers,
        comm_s=comm_s,
        overlappable_s=max(0.0, comm_s - exposed),
        comm_hidden=exposed <= 0.01 * compute,
        total_s=compute + exposed + optimizer_s,
        link=link,
        note=note,
        collectives=collectives,
        optimizer_s=optimizer_s,
        attention_s=attention_compute,
        exposed_s=exposed,
    )


def _weight_and_tensor_collectives(s: Problem, profile: HardwareProfile, t: Training, passes) -> list[Collective]:
    """The data-parallel collectives of the weights (over the devices sharing a tensor shard, across all devices)
    and the tensor-parallel ones (plan/collectives.py)."""
    p, tp, (block, head) = ELEMENT_BYTES[s.dtype], t.tensor_parallel, _units(s, t.tensor_parallel)
    total = device_parameters(s, t) * p
    params = Sharded(total, max(block, head) * p, total - s.layers * (block * p - _gathered(s, tp)))
    shard_group = Group(t.shards, t.devices if t.shards == t.replicas else t.shards * tp)  # HSDP: consecutive
    out = data_parallel(s, profile, t.zero, shard_group, params, passes)
    if t.shards < t.replicas and s.mode == "fwdbwd":  # HSDP: the gradient shard all-reduced across the copies
        out.append(replicate_all_reduce(profile, Group(t.replicas // t.shards, t.devices), params, t.shards, passes[1]))
    tokens = s.batch * (s.seq_len // t.sequence_parallel)
    return out + tensor_parallel(s, profile, tp, tokens, s.checkpointing and s.mode == "fwdbwd")


def _host_side(s: Problem, profile: HardwareProfile, t: Training, compute: tuple[float, float], step_s: float):
    """plan/offload.py: the host copies of a step (as collectives over the host link) and the optimizer step's
    seconds (on the host's CPUs where the optimizer is offloaded, else `step_s`)."""
    shard = device_parameters(s, t) * ELEMENT_BYTES[s.dtype] / t.shards
    local = local_part(tensor.token_share(s, t.tensor_parallel), t.sequence_parallel)
    copies = [Collective(**c, link="host") for c in host.transfers(s, t, profile, shard, compute, local)]
    if "optimizer" in t.offload:
        states = model_states(s, t, "cuda")
        step_s = host.host_step_seconds(profile, states, shard, min(t.devices, profile.devices_per_node))
    return copies, step_s


def _optimizer_seconds(s: Problem, profile: HardwareProfile, t: Training) -> float:
    """The optimizer step reads the gradients and reads and writes the weights, states and master copy of this
    device's shard, at memory_bandwidth x efficiency.memory_bandwidth (memory-bound, a model)."""
    states = model_states(s, t)
    resident = sum(v for k, v in states.resident.items() if not k.startswith("DDP"))
    gradients = sum(v for k, v in states.step.items() if k.startswith("gradients"))
    n = t.shards
    if t.zero < 3 and t.zero >= 1 and n > 1:  # only this device's shard of the weights is updated
        resident -= sum(v for k, v in states.resident.items() if k.startswith("parameters")) * (1 - 1 / n)
    return profile.memory_seconds(2 * resident + gradients / (n if 1 <= t.zero < 2 else 1))
