"""The planner's answers: memory (plan/memory.py, plan/layers.py) and time (plan/time.py, plan/layers.py)
for one Problem on a hardware profile, and the solvers built on them (largest N that fits, fewest
devices for an N, ring chunk advice), plus the prediction a bench row carries.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, SerializeAsAny

from ..workload.counts import FWD_BWD_FACTOR, shard_of, spanning_pairs
from ..workload.parse import MAX_SEQ_LEN
from ..workload.problem import ELEMENT_BYTES, SIZE_LIMITS, Problem
from . import tensor
from .layers import attention_call, estimate_layer_time, layer_memory, local_part
from .memory import MemoryBreakdown, estimate_memory, framework_bytes, reserved_bytes
from .offload import host_bytes_per_node
from .parallel import Training, model_memory, model_states, model_time
from .profiles import HardwareProfile, load_profile
from .throughput import Throughput, throughput
from .time import TimeBreakdown, compute_efficiency, estimate_time

SEQ_SEARCH_CAP = MAX_SEQ_LEN  # max_seq searches no further: a Problem takes no longer sequence
DEVICE_SEARCH_CAP = SIZE_LIMITS["world_size"]  # min_devices likewise


class Plan(BaseModel):
    problem: Problem
    profile: str
    devices: int
    memory: SerializeAsAny[MemoryBreakdown]  # a LayerMemory (with its phase) for layer/model problems
    capacity_bytes: int
    fits: bool
    time: SerializeAsAny[TimeBreakdown] | None  # a parallel.StepTime (with its collectives) for a model's training
    feasible: bool
    reason: str
    shard_len: int | None = None  # distributed: positions per device, N padded to devices x shard_len
    training: Training | None = None  # a whole model's layout over devices and its optimizer (plan/parallel.py)
    # what a GPU would report reserved at the peak (plan/memory.py ALLOCATOR_MARGIN); `fits` judges memory.total
    reserved_bytes: int | None = None
    host_bytes: int | None = None  # plan --offload: what the node's host memory holds (plan/offload.py)
    # a model's training step (plan/throughput.py): the per-device figures --json carries at the top
    peak_bytes: int | None = None
    tokens_per_s_per_device: float | None = None
    mfu: float | None = None
    throughput: Throughput | None = None
    max_seq_len: int | None = None  # --max-seq's answer


class SeqSearch(BaseModel):
    """max_seq's answer: the largest N found to fit, its plan, and whether the search stopped at its cap
    (then every N it tried fits: `seq_len` is no bound, only how far it looked)."""

    seq_len: int
    plan: Plan | None
    capped: bool


class Headroom(BaseModel):
    """What is left around a plan: free memory at its peak (negative: over by), the largest N at its batch and the
    largest batch at its N that still fit (None: none fits; `*_capped`: the search stopped at its cap)."""

    free_bytes: int
    largest_seq_len: int | None
    seq_len_capped: bool = False
    largest_batch: int | None
    batch_capped: bool = False


def headroom(result: Plan, profile: HardwareProfile, training: Training | None = None) -> Headroom:
    s = result.problem
    free = result.capacity_bytes - result.memory.total
    if s.documents is not None:  # fixed documents: neither N nor the batch (1) can grow
        return Headroom(free_bytes=free, largest_seq_len=None, largest_batch=None)
    devices = s.world_size if training is not None else result.devices
    found = max_seq_search(s, profile, devices, training)
    batch, batch_capped = max_batch(s, profile, devices, training)
    return Headroom(
        free_bytes=free,
        largest_seq_len=found.seq_len or None,
        seq_len_capped=found.capped,
        largest_batch=batch or None,
        batch_capped=batch_capped,
    )


def max_batch(
    s: Problem, profile: HardwareProfile, devices: int = 1, training: Training | None = None
) -> tuple[int, bool]:
    """Largest batch (at most the Problem's limit) whose plan fits at s.seq_len: doubling, then bisection (memory
    grows with the batch); (0, False) if not even one fits, (cap, True) if the cap does."""
    batch, _, capped = _largest_fitting(s, "batch", 1, SIZE_LIMITS["batch"], profile, devices, training)
    return batch, capped


def _largest_fitting(
    s: Problem, field: str, step: int, cap: int, profile: HardwareProfile, devices: int, training: Training | None
) -> tuple[int, Plan | None, bool]:
    """The largest multiple of `step` up to `cap` that `field` of `s` can take with its plan fitting (memory grows
    with it): doubling, then bisection. (n, its plan, whether the cap itself fits); (0, None, False) if `step`
    does not fit."""

    def fits(n: int) -> Plan | None:
        p = plan(s.model_copy(update={field: n}), profile, devices, training)
        return p if p.fits else None

    top = cap // step * step
    lo, best, hi = 0, None, step
    while (p := fits(hi)) is not None:
        lo, best = hi, p
        if hi == top:
            return lo, best, True
        hi = min(hi * 2, top)
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if (p := fits(mid)) is not None:
            lo, best = mid, p
        else:
            hi = mid
    return lo, best, False


def _device_type(profile: HardwareProfile) -> str:
    return "cpu" if profile.kind == "cpu" else "cuda"


def _memory(s: Problem, profile: HardwareProfile) -> MemoryBreakdown:
    if s.target != "attention":
        if s.world_size > 1:
            raise ValueError(
                f"--target {s.target} is planned on one device; --world-size {s.world_size} applies to attention"
            )
        return layer_memory(s, framework_bytes(profile, s.mode), _device_type(profile))
    if s.world_size > 1 and not s.spec.distributed:
        raise ValueError(f"{s.impl} runs on one process, not on {s.world_size} devices: plan a distributed --impl")
    if s.world_size > 1 and (reason := s.spec.shard_rule(s, s.world_size)):
        raise ValueError(f"{s.impl} cannot shard N={s.seq_len:,} over {s.world_size} devices: {reason}")
    return estimate_memory(s, framework_bytes(profile, s.mode), _device_type(profile))


def plan(s: Problem, profile: HardwareProfile, devices: int | None = None, training: Training | None = None) -> Plan:
    """Memory per device and time per call of `s` on `devices` x `profile`, and whether it fits; a model with
    `training`: its step on training.devices laid out and optimised as that says (plan/parallel.py)."""
    if training is not None and s.target == "model":
        return _model_plan(s, profile, training)
    devices = devices or s.world_size
    s = s.model_copy(update={"world_size": devices})
    if devices > s.seq_len:
        return _built(s, profile, devices, f"{devices:,} devices for N={s.seq_len:,}: each needs at least one position")
    try:
        memory = _memory(s, profile)
    except ValueError as exc:
        return _built(s, profile, devices, str(exc))
    try:
        time = estimate_layer_time(s, profile) if s.target != "attention" else estimate_time(s, profile)
    except ValueError as exc:
        return _built(s, profile, devices, str(exc), memory)
    shard = shard_of(s) if devices > 1 and s.target == "attention" else None
    return _built(s, profile, devices, None, memory, time, shard)


def _built(
    s: Problem,
    profile: HardwareProfile,
    devices: int,
    refused: str | None,
    memory: MemoryBreakdown | None = None,
    time: TimeBreakdown | None = None,
    shard: int | None = None,
    training: Training | None = None,
) -> Plan:
    """The plan of `s`: feasible when its memory fits and nothing else (`refused`, the reason) rules it out."""
    capacity = profile.memory_bytes
    fits = memory is not None and memory.total <= capacity
    if refused is not None:
        reason = refused
    elif fits:
        reason = f"fits: {memory.total / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB per device"
    else:
        reason = f"does not fit: needs {memory.total / 2**30:.2f} GiB per device, has {capacity / 2**30:.2f} GiB"
    return Plan(
        problem=s,
        profile=profile.name,
        devices=devices,
        memory=memory or MemoryBreakdown(items={}, total=0),
        capacity_bytes=capacity,
        fits=fits,
        time=time,
        feasible=fits and refused is None,
        reason=reason,
        shard_len=shard,
        training=training,
        reserved_bytes=reserved_bytes(memory, profile) if memory is not None else None,
    )


def _model_plan(s: Problem, profile: HardwareProfile, training: Training) -> Plan:
    try:
        memory = model_memory(s, profile, training, _device_type(profile))
        time = model_time(s, profile, training)
    except ValueError as exc:
        return _built(s, profile, training.devices, str(exc), training=training)
    sp = training.sequence_parallel
    shard = shard_of(attention_call(s, sp)) if sp > 1 else None
    result = _built(s, profile, training.devices, None, memory, time, shard, training)
    rate = throughput(s, profile, time, training) if s.mode == "fwdbwd" else None
    if rate is not None:
        result = result.model_copy(
            update=dict(
                peak_bytes=memory.total,
                throughput=rate,
                tokens_per_s_per_device=rate.tokens_per_s_per_device,
                mfu=rate.mfu,
            )
        )
    return _host_checked(result, s, profile, training) if training.offload else result


def _host_checked(result: Plan, s: Problem, profile: HardwareProfile, training: Training) -> Plan:
    """An offloading plan with its host bytes per node; it does not fit where they exceed the host's memory."""
    node = min(training.devices, profile.devices_per_node)
    states = model_states(s, training, _device_type(profile))
    local = local_part(tensor.token_share(s, training.tensor_parallel), training.sequence_parallel)
    need = host_bytes_per_node(s, training, states, local, node)
    update = {"host_bytes": need}
    if need > (has := profile.host.memory_gib_per_node * 2**30):
        host = f"the host needs {need / 2**30:,.1f} GiB per node ({node} devices), has {has / 2**30:,.1f} GiB"
        reason = f"{result.reason}; {host}" if not result.fits else f"does not fit: {host}"
        update.update(fits=False, feasible=False, reason=reason)
    return result.model_copy(update=update)


def predicted_peak_bytes(s: Problem) -> int | None:
    """What a bench row of `s` should measure, by the memory model: on CPU, RSS above the worker's start-up,
    so the CPU host profile's fixed runtime cost is included; on CUDA the caching allocator's view, which
    does not see the CUDA context, so none is added. None where the planner has no model; 0 for a shape
    it cannot plan (e.g. unaligned shards), so that the point decides for itself."""
    if s.spec.memory_model is None:
        return None
    device_type = "cuda" if s.device.startswith("cuda") else "cpu"
    fixed = framework_bytes(load_profile("cpu-host"), s.mode) if device_type == "cpu" else 0
    estimate = estimate_memory if s.target == "attention" else layer_memory
    try:
        return estimate(s, fixed, device_type).total
    except ValueError:
        return 0 if s.target == "attention" else None


def _granule(s: Problem, devices: int) -> int:
    """The N searched are multiples of this: shards that align with the segments without padding (any other N
    is padded to such a length by the kernels, so it costs as much as the next multiple)."""
    step = devices
    if devices > 1 and s.spec.strategy in ("ring", "allgather"):
        for w in s.segment_lengths:
            step = math.lcm(step, w if w % devices == 0 else w * devices)
    return step


def max_seq(
    s: Problem, profile: HardwareProfile, devices: int = 1, training: Training | None = None
) -> tuple[int, Plan | None]:
    """Largest N (a multiple of the alignment granule) whose plan fits on `devices` devices (a model: laid out
    by `training`); (0, None) if none does. At the search cap (see max_seq_search) N is the cap itself."""
    found = max_seq_search(s, profile, devices, training)
    return found.seq_len, found.plan


def max_seq_search(
    s: Problem, profile: HardwareProfile, devices: int = 1, training: Training | None = None
) -> SeqSearch:
    """Largest N (a multiple of the alignment granule, at most SEQ_SEARCH_CAP) whose plan fits on `devices`
    devices. Memory grows monotonically with N, so doubling then bisection finds it; when even the cap
    fits, the answer says so (capped) instead of passing the cap off as the largest N."""
    if training is not None and s.target == "model":
        devices = training.sequence_parallel  # the sequence is shared by the sp devices of a replica
    granule = _granule(attention_call(s, devices) if devices > 1 and s.target != "attention" else s, devices)
    if training is not None and s.target == "model":  # tensor parallelism splits each sp shard T ways
        granule = math.lcm(granule, training.sequence_parallel * training.tensor_parallel)
    if granule > SEQ_SEARCH_CAP:
        return SeqSearch(seq_len=0, plan=None, capped=False)
    n, best, capped = _largest_fitting(s, "seq_len", granule, SEQ_SEARCH_CAP, profile, devices, training)
    return SeqSearch(seq_len=n, plan=best, capped=capped)


def _fewest(at, limit: int, replicated: bool = False) -> tuple[int | None, Plan | None]:
    """The smallest k (doubling, then refined) whose plan at(k) fits, with that plan; (None, None) if none up to
    `limit` (or beyond one when `replicated`: more devices never lower the memory per device)."""
    k = 1
    while k <= limit:
        p = at(k)
        if p.fits:
            for candidate in range(k // 2 + 1, k):  # any count: N not divisible by it is padded
                if (q := at(candidate)).fits:
                    return candidate, q
            return k, p
        if replicated and k > 1:
            return None, None
        k *= 2
    return None, None


def min_devices(s: Problem, profile: HardwareProfile, limit: int = DEVICE_SEARCH_CAP) -> tuple[int | None, Plan | None]:
    """Fewest devices (powers of two, then refined) on which N fits; (None, None) if none up to `limit`
    (nor up to N: a device holds at least one position)."""
    return _fewest(lambda d: plan(s, profile, d), min(limit, s.seq_len))


def min_model_devices(
    s: Problem, profile: HardwareProfile, training: Training, limit: int = DEVICE_SEARCH_CAP
) -> tuple[int | None, Plan | None]:
    """Fewest devices (multiples of the sequence- times tensor-parallel degree: doubling, then refined) on which a
    model's step fits with `training`'s ZeRO stage and optimizer; (None, None) if none up to `limit`. Memory per
    device does not grow with more devices under ZeRO beyond the NCCL buffers of the groups a second replica adds
    (DDP keeps every state on every device: only one or none)."""
    sp = training.sequence_parallel * training.tensor_parallel

    def at(replicas: int) -> Plan:
        return plan(s, profile, training=training.model_copy(update={"devices": replicas * sp}))

    replicas, p = _fewest(at, limit // sp, training.zero == 0)
    return (replicas * sp if replicas else None), p


def chunk_advice(s: Problem, profile: HardwareProfile, devices: int) -> str:
    """For ring strategies: the shard (chunk) length at which one ring step's transfer hides under its
    compute, from per-pair step compute vs step transfer time."""
    if s.spec.strategy != "ring" or devices < 2:
        return "no ring: chunk size does not apply"
    e = ELEMENT_BYTES[s.dtype]
    link = profile.link(devices)[1]
    sharded = s.model_copy(update={"world_size": devices})
    # the efficiency of this shard's blocks (plan/time.py: the kernel's curve, or the profile's prior)
    peak = (profile.peak_flops(s.dtype) or 0) * compute_efficiency(sharded, profile)[1]
    if peak <= 0:
        return "the profile has no rate for this dtype"
    worst = None
    shard = shard_of(sharded)
    spanning = {r for g, r, _ in spanning_pairs(sharded)}
    for w, r in zip(s.segment_lengths, s.dilation_rates):
        if r not in spanning:
            continue
        # one step: (L/r)² pairs per head (4·D flops each, x3.5 with backward) vs 2·(L/r)·H·D·e bytes:
        # compute grows with L², the transfer with L, so a step hides its transfer once L is large enough
        per_l2 = 4 * s.head_dim * s.batch * s.heads / r**2 * (FWD_BWD_FACTOR if s.mode == "fwdbwd" else 1) / peak
        per_l = profile.transfer_seconds(devices, 0, 2 * s.batch * s.heads * s.head_dim * e / r)
        threshold = per_l / per_l2 + (link.latency_us * 1e-6 / per_l2) ** 0.5
        if worst is None or threshold > worst[0]:
            worst = (threshold, w, r)
    if worst is None:
        return f"every segment fits in a shard of L = {shard:,}: no ring traffic"
    threshold, w, r = worst
    verdict = "hidden" if shard >= threshold else "exposed"
    return (
        f"the sparsest spanning pair (w={w}, r={r}) hides its ring transfer once the shard L >= {int(threshold):,}; "
        f"here L = {shard:,}: {verdict}"
    )
