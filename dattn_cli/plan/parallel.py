"""Whole-model training plans across devices (`plan --target model --devices N`): data parallel (DDP),
ZeRO stages 1-3 / FSDP, sequence parallel attention and their product, the optimizer's states, and the
gradient and parameter collectives with their overlap (docs/plan.md, "Whole-model plans across devices").

Layout: N devices = dp x sp. A data-parallel replica of sp devices shares each of its --batch sequences,
each device holding L = N/sp positions (the attention's shard rule, registry.shard_length); every device
holds the same weights, so ZeRO shards over all N (sequence-parallel ranks share the shards, as
DeepSpeed-Ulysses does) and gradients are reduced over all N.

Model states per device, P parameters, p bytes per weight (--dtype), Ψ as in the ZeRO paper
(Rajbhandari et al. 2020, arXiv:1910.02054, §3.1: mixed-precision Adam holds 2Ψ + 2Ψ + 12Ψ):
* parameters P·p, /N with ZeRO-3; gradients P·p (in the weight dtype, as autograd makes them), /N with
  ZeRO-2 and 3; optimizer states and the fp32 master copy, /N with ZeRO >= 1 (OPTIMIZERS)
* DDP's buckets: torch DDP copies gradients into its all-reduce buckets unless gradient_as_bucket_view=True
  ("the saved memory size will be equal to the total gradients size", torch.nn.parallel.DistributedDataParallel
  docs): P·p more, allocated when DDP is built
* ZeRO-3/FSDP: the unit in use and the prefetched one all-gathered (p bytes): max(2 blocks, head + block);
  ZeRO-2/3: the unsharded gradient of the unit being reduce-scattered
Collectives (ring algorithms; bytes each device sends, NCCL's bus-bandwidth convention, nccl-tests
doc/PERFORMANCE.md): all-reduce 2(N-1)/N·G, all-gather and reduce-scatter (N-1)/N·G, at the profile's
intra-node link while N <= devices_per_node, else inter-node. DDP: one all-reduce of the gradients; ZeRO-1/2:
a reduce-scatter of the gradients and an all-gather of the updated parameters; ZeRO-3: all-gathers in the
forward and in the backward and a reduce-scatter of the gradients (3Ψ against DDP's 2Ψ, ZeRO paper §7.2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

from ..kernels.registry import names
from ..workload.architecture import block_matmul_parameters, block_parameters_of
from ..workload.counts import linear_flops
from ..workload.problem import ELEMENT_BYTES, SIZE_LIMITS, Problem
from . import fp8, nccl, offload as host
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
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default
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
    zero: Literal[0, 1, 2, 3] = 0
    optimizer: Optimizer = "adamw"
    loss: Loss = "standard"  # plan/loss.py
    # plan/recompute.py; None: as the Problem's checkpointing says (full or none); given, it must agree with it
    recompute: Recompute | None = None
    offload: tuple[host.Offload, ...] = ()  # plan/offload.py: what lives in host memory

    @field_validator("devices", "sequence_parallel")
    @classmethod
    def _count(cls, value: int, info) -> int:
        option = "--devices" if info.field_name == "devices" else "--sequence-parallel"
        if not 1 <= value <= SIZE_LIMITS["world_size"]:
            raise ValueError(f"{option} must be from 1 to {SIZE_LIMITS['world_size']:,}, got {value:,}")
        return value

    @model_validator(mode="after")
    def _layout(self) -> Training:
        if self.devices % self.sequence_parallel:
            raise ValueError(
                f"--sequence-parallel {self.sequence_parallel} does not divide --devices {self.devices}: "
                "devices = data parallel x sequence parallel"
            )
        return self

    @property
    def data_parallel(self) -> int:
        return self.devices // self.sequence_parallel

    def describe(self) -> str:
        return (
            f"{self.devices} devices = dp {self.data_parallel} x sp {self.sequence_parallel}; "
            f"{ZERO_NAMES[self.zero] if self.devices > 1 else 'one device'}; {OPTIMIZERS[self.optimizer][1]}"
            + ("; chunked loss (no full logits)" if self.loss == "chunked" else "")
            + ("; selective recompute (matmul and attention outputs kept)" if self.recompute == "selective" else "")
            + (f"; offloaded to the host: {', '.join(self.offload)}" if self.offload else "")
        )


def check_impl(s: Problem, t: Training) -> None:
    """A sequence-parallel layout needs a distributed multihead attention (bad input: the CLI exits 2)."""
    if t.sequence_parallel > 1 and not s.spec.distributed:
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
    if reason := s.spec.shard_rule(attention_call(s, sp), sp):
        raise ValueError(f"{s.impl} cannot shard N={s.seq_len:,} over --sequence-parallel {sp}: {reason}")


def optimizer_bytes(optimizer: str, weight_bytes: int) -> tuple[float, float]:
    """(state bytes, fp32 master-copy bytes) per parameter. Half weights train against an fp32 master copy
    (mixed precision, whatever the optimizer); fp32 weights (--dtype float32, with or without --amp) are
    their own master. torch-adamw is what dattn bench's model step runs: states in the weight dtype."""
    states, _ = OPTIMIZERS[optimizer]
    if states is None:
        return 2.0 * weight_bytes, 0.0
    return states, 4.0 if weight_bytes < 4 else 0.0


def _units(s: Problem) -> tuple[int, int]:
    """(parameters of the largest block, of the tied embedding/head): FSDP's wrapping units."""
    return block_parameters_of(s), s.vocab_size * s.width


def _gathered(s: Problem, block: int) -> float:
    """Bytes of a block's parameters in an FSDP all-gather: p each, its matmuls' 1 with torchao's float8
    all-gather (plan/fp8.py)."""
    matmul = block_matmul_parameters(s)
    return (block - matmul) * ELEMENT_BYTES[s.dtype] + matmul * fp8.gathered_matmul_bytes(s)


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
    p, params, n, z = ELEMENT_BYTES[s.dtype], model_parameters(s), t.devices, t.zero
    block, head = _units(s)
    sharded = n > 1
    resident = {"parameters" + (f" (1/{n} shard)" if z == 3 and sharded else ""): params * p / (n if z == 3 else 1)}
    forward = {}
    if z == 3 and (sharded or "parameters" in t.offload):
        gathered = _gathered(s, block)
        forward["all-gathered parameters (unit in use + prefetched)"] = max(2 * gathered, head * p + gathered)
    if s.mode != "fwdbwd":
        return ModelStates(resident, forward=forward, step_name="no optimizer step")
    states, master = optimizer_bytes(t.optimizer, p)
    split = n if z >= 1 else 1
    shard = f" (1/{n} shard)" if z >= 1 and sharded else ""
    resident[f"optimizer states{shard}"] = params * states / split
    if master:
        resident[f"fp32 master weights{shard}"] = params * master / split
    if z == 0 and sharded:
        resident["DDP gradient buckets (all-reduce copies)"] = params * p
    backward = dict(forward)
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
        on_host[f"{host.HOST_GRADIENTS}{shard}"] = params * 4 / split
    name = "optimizer step" + (" (on the host)" if "optimizer" in t.offload else "")
    return ModelStates(resident, step, backward, forward, name, host=on_host)


def model_memory(s: Problem, profile: HardwareProfile, t: Training, device_type: str) -> LayerMemory:
    """Peak bytes per device of one training step of `s` laid out by `t`, itemised for the peak phase."""
    check_layout(s, t)
    check_recompute(s, t.recompute)
    host.check(s, t, profile.host is not None, profile.name)
    states = model_states(s, t, device_type)
    if device_type == "cuda":
        buffers, name = nccl.buffer_bytes(t.devices, t.sequence_parallel, s.spec.strategy, profile.devices_per_node)
        states.resident.update({name: buffers} if buffers else {})
    options = StepOptions(t.loss, t.recompute == "selective", "activations" in t.offload)
    return layer_memory(s, framework_bytes(profile, s.mode), device_type, states, t.sequence_parallel, options)


class Collective(BaseModel):
    name: str
    bytes: int  # sent per device
    seconds: float
    exposed_s: float  # the part not hidden under compute
    overlap: str  # the overlap assumption
    link: str = "intra-node"


class StepTime(TimeBreakdown):
    collectives: list[Collective] = []
    optimizer_s: float = 0.0


def _timed(
    name: str, nbytes: float, messages: int, profile: HardwareProfile, n: int, overlap: str, exposed: Callable
) -> Collective:
    """One collective over n devices; `exposed(seconds)` is the part of its time not hidden under compute."""
    seconds, link = profile.transfer_seconds(n, messages, nbytes), profile.link(n)[0]
    return Collective(
        name=name, bytes=int(nbytes), seconds=seconds, exposed_s=exposed(seconds), overlap=overlap, link=link
    )


def _ddp_all_reduce(total: int, profile: HardwareProfile, n: int, backward_s: float) -> Collective:
    share = (n - 1) / n
    buckets = max(1, -(-total // DDP_BUCKET_BYTES))
    last = profile.transfer_seconds(n, 2 * (n - 1), 2 * share * min(total, DDP_BUCKET_BYTES))
    overlap = (
        "25 MiB buckets all-reduced during the backward; what exceeds the backward compute and the last bucket "
        "are exposed"
    )
    exposed = lambda sec: max(0.0, sec - backward_s) + last
    return _timed("DDP all-reduce of gradients", 2 * share * total, buckets * 2 * (n - 1), profile, n, overlap, exposed)


def data_parallel_collectives(
    s: Problem, profile: HardwareProfile, t: Training, forward_s: float, backward_s: float
) -> list[Collective]:
    """The gradient and parameter collectives of one step and what of each is exposed (module docstring)."""
    n, z = t.devices, t.zero
    if n == 1 or (s.mode != "fwdbwd" and z != 3):
        return []
    total = model_parameters(s) * ELEMENT_BYTES[s.dtype]
    if s.mode == "fwdbwd" and z == 0:
        return [_ddp_all_reduce(total, profile, n, backward_s)]
    block, head = _units(s)
    share = (n - 1) / n
    messages = (s.layers + 1) * (n - 1)  # one collective per unit: every block, and the embedding/head
    unit = profile.transfer_seconds(n, n - 1, share * max(block, head) * ELEMENT_BYTES[s.dtype])

    def timed(name: str, overlap: str, exposed: Callable, nbytes: float = total) -> Collective:
        return _timed(name, share * nbytes, messages, profile, n, overlap, exposed)

    if z < 3:  # ZeRO-1/2: gradients reduce-scattered during the backward, updated parameters all-gathered after
        return [
            timed(
                "ZeRO reduce-scatter of gradients",
                "per unit during the backward; what exceeds the backward and the last unit exposed",
                lambda sec: max(0.0, sec - backward_s) + unit,
            ),
            timed(
                "ZeRO all-gather of updated parameters",
                "after the optimizer step, nothing to hide under: exposed",
                lambda sec: sec,
            ),
        ]
    gathered = total - s.layers * (block * ELEMENT_BYTES[s.dtype] - _gathered(s, block))  # torchao fp8: less
    out = [
        timed(
            "FSDP all-gather (forward)",
            "prefetched one unit ahead under the forward; the first unit's gather exposed",
            lambda sec: max(0.0, sec - forward_s) + unit,
            gathered,
        )
    ]
    if s.mode != "fwdbwd":
        return out
    gather = timed(
        "FSDP all-gather (backward)",
        "prefetched one unit ahead under the backward",
        lambda sec: max(0.0, sec - backward_s),
        gathered,
    )
    room = max(0.0, backward_s - gather.seconds)
    reduce = timed(
        "FSDP reduce-scatter of gradients",
        "per unit under the backward compute left after the all-gathers; the last unit exposed",
        lambda sec: max(0.0, sec - room) + unit,
    )
    return [*out, gather, reduce]


def model_time(s: Problem, profile: HardwareProfile, t: Training) -> StepTime:
    """Time per training step per device: compute of the local positions (attention at its sequence-parallel
    layout, linear layers at the matmul efficiency), the attention's exposed communication, the data-parallel
    collectives' exposed part, and the optimizer step at memory bandwidth."""
    sp = t.sequence_parallel
    call, local = attention_call(s, sp), local_part(s, sp)
    attention = estimate_time(call, profile)
    recompute_attention, recompute_linear = recompute_factors(s, t.recompute == "selective")
    attention_compute = (attention.compute_s + attention.memory_s) * s.layers * recompute_attention
    sp_exposed = max(0.0, attention.total_s - attention.compute_s - attention.memory_s) * s.layers * recompute_attention
    linear_s = linear_seconds(s, profile, linear_flops(local) * recompute_linear)
    compute = attention_compute + linear_s
    train = s.mode == "fwdbwd"
    forward_s = compute / 3 if train else compute  # linear fwd is 1/3 of fwd+bwd, attention 1/3.5: about a third
    link = profile.link(t.devices)[0]
    collectives = data_parallel_collectives(s, profile, t, forward_s, compute - forward_s)
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
        f"attention {attention_compute * 1e3:.1f} ms + linear layers {linear_s * 1e3:.1f} ms; optimizer step "
        f"{optimizer_s * 1e3:.1f} ms at {'host ' if 'optimizer' in t.offload else ''}memory bandwidth; "
        f"communication exposed {exposed * 1e3:.1f} ms"
    )
    flops = attention.flops * s.layers + linear_flops(local)
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
    )


def _host_side(s: Problem, profile: HardwareProfile, t: Training, compute: tuple[float, float], step_s: float):
    """plan/offload.py: the host copies of a step (as collectives over the host link) and the optimizer step's
    seconds (on the host's CPUs where the optimizer is offloaded, else `step_s`)."""
    shard = model_parameters(s) * ELEMENT_BYTES[s.dtype] / t.devices
    local = local_part(s, t.sequence_parallel)
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
    if t.zero < 3 and t.zero >= 1 and t.devices > 1:  # only this device's shard of the weights is updated
        resident -= sum(v for k, v in states.resident.items() if k.startswith("parameters")) * (1 - 1 / t.devices)
    return profile.memory_seconds(2 * resident + gradients / (t.devices if 1 <= t.zero < 2 else 1))
