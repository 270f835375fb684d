"""The planner: memory (plan/memory.py) and time for one configuration on a hardware profile, and the
solvers built on them (largest N that fits, fewest devices for an N, ring chunk advice).

Time model (per device, one layer's attention call):
* compute   = FLOPs / (peak[dtype] x efficiency); FLOPs by the SPEC convention (4·D·P forward,
              P = attended pairs this device computes; fwd+bwd = 3.5 x), efficiency per implementation
              from the profile (`plan --calibrate` fits it)
* comm      = Σ messages (latency + bytes / (bandwidth x efficiency)); the link is intra-node while the
              group fits in `devices_per_node`, else inter-node; bytes from the closed forms of
              docs/communication.md (kernels/sequence_parallel.comm_volume), head-parallel's all-to-all
* ring overlap: each ring step's transfer hides under the previous step's compute when
              step compute time >= step transfer time; total = compute + max(0, comm - overlappable)
"""

from __future__ import annotations

from pydantic import BaseModel, SerializeAsAny

from ..kernels.pattern import attended_pairs, build_blocks
from .memory import ELEMENT_BYTES, MemoryBreakdown, Shape, estimate_memory, strategy_for
from .profiles import HardwareProfile

DENSE = ("sdpa", "flash", "math")
FWD_BWD_FACTOR = 3.5


class TimeBreakdown(BaseModel):
    flops: float
    compute_s: float
    comm_bytes: int
    messages: int
    comm_s: float
    overlappable_s: float
    comm_hidden: bool
    total_s: float
    link: str
    note: str


class Plan(BaseModel):
    shape: SerializeAsAny[Shape]  # a LayerShape for --target layer|model
    profile: str
    devices: int
    memory: SerializeAsAny[MemoryBreakdown]
    capacity_bytes: int
    fits: bool
    time: TimeBreakdown | None
    feasible: bool
    reason: str


def normalise(shape: Shape) -> Shape:
    strategy = strategy_for(shape.impl, shape.world_size)
    return shape.model_copy(update={"strategy": strategy})


def attended_pairs_per_device(s: Shape) -> int:
    if s.impl in DENSE:
        n = s.seq_len
        total = s.batch * s.heads * (n * (n + 1) // 2 if s.causal else n * n)
    else:
        blocks = build_blocks(s.seq_len, s.heads, s.segment_lengths, s.dilation_rates, s.semantics)
        total = attended_pairs(s.batch, blocks, s.causal)
    return total // max(1, s.world_size)


def flops_per_device(s: Shape) -> float:
    return 4.0 * s.head_dim * attended_pairs_per_device(s) * (FWD_BWD_FACTOR if s.mode == "fwdbwd" else 1.0)


def estimate_time(s: Shape, profile: HardwareProfile) -> TimeBreakdown:
    s = normalise(s)
    peak = profile.peak_flops(s.dtype)
    if peak is None:
        raise ValueError(f"profile {profile.name!r} has no {s.dtype} rate (null in its peak_tflops): pick another --dtype")
    flops = flops_per_device(s)
    compute = flops / (peak * profile.efficiency.compute_for(s.impl, s.mode))
    p = s.world_size
    link = profile.intra_node if p <= profile.devices_per_node else profile.inter_node
    link_name = "intra-node" if p <= profile.devices_per_node else "inter-node"
    comm_bytes, messages, overlappable, note = 0, 0, 0.0, "single device: no communication"
    e = ELEMENT_BYTES[s.dtype]
    if p > 1 and s.strategy in ("ring", "allgather"):
        comm_bytes, messages, steps_share = sequence_parallel_traffic(s)
        # the remote blocks' compute is what a ring transfer can hide under
        overlappable = compute * steps_share if s.strategy == "ring" else 0.0
        note = ("ring: per step, transfer vs compute of the previous block" if s.strategy == "ring"
                else "all-gather: a collective before the remote blocks, not overlapped")
    elif p > 1 and s.strategy == "head_parallel":
        x = s.batch * (s.seq_len // p) * s.heads * s.head_dim * e
        comm_bytes = 4 * x * (p - 1) // p * (2 if s.mode == "fwdbwd" else 1)
        messages = 4 * (2 if s.mode == "fwdbwd" else 1) * (p - 1)
        note = "head-parallel: all-to-alls before and after attention, not overlapped"
    comm = messages * link.latency_us * 1e-6 + comm_bytes / (link.bandwidth_gb_s * 1e9 * profile.efficiency.communication)
    hidden = comm <= overlappable if messages else True
    total = compute + max(0.0, comm - overlappable)
    return TimeBreakdown(flops=flops, compute_s=compute, comm_bytes=comm_bytes, messages=messages, comm_s=comm,
                         overlappable_s=overlappable, comm_hidden=hidden, total_s=total, link=link_name, note=note)


def spanning_pairs(s: Shape) -> list[tuple[int, int, int]]:
    """(g, r, heads using the pair) for each pair whose segment spans g > 1 devices (docs/communication.md)."""
    p = s.world_size
    shard = s.seq_len // p
    pairs = []
    m = len(s.segment_lengths)
    for i, (w, r) in enumerate(zip(s.segment_lengths, s.dilation_rates)):
        span = min(w, s.seq_len)
        if shard % span == 0:
            continue
        if span % shard:
            raise ValueError(f"segment length {span} neither divides nor is a multiple of N/p = {shard}: "
                             "use segment lengths that are divisors or multiples of N/p")
        base, extra = divmod(s.heads, m)
        heads = s.heads if s.semantics == "longnet" else base + (1 if i < extra else 0)
        pairs.append((span // shard, r, heads))
    return pairs


def sequence_parallel_traffic(s: Shape) -> tuple[int, int, float]:
    """(bytes received by the busiest device, messages on its critical path, remote share of its compute).

    Closed form per spanning pair with S = 2·B·H_i·D·e·⌈L/r⌉ (the packed kept K/V of one device; exact
    when r divides L, where it equals kernels.sequence_parallel.comm_volume): ring non-causal
    (g-1)·S forward, 3·(g-1)·S fwd+bwd (rotation twice, dK/dV home); causal, the last device of a
    group: (g-1)·S forward, 2·(g-1)·S fwd+bwd. All-gather: (g-1)·S forward, 2·(g-1)·S fwd+bwd.
    Messages: the ring has g-1 steps per pass; a ring all-gather also takes g-1 latency hops.
    """
    e = ELEMENT_BYTES[s.dtype]
    shard = s.seq_len // s.world_size
    fwdbwd = s.mode == "fwdbwd"
    total, messages, remote = 0, 0, 0.0
    pairs = spanning_pairs(s)
    for g, r, heads in pairs:
        size = 2 * s.batch * heads * s.head_dim * e * -(-shard // r)
        if s.strategy == "ring":
            passes = (2 if s.causal else 3) if fwdbwd else 1
            messages += (g - 1) * (3 if fwdbwd else 1)
        else:
            passes = 2 if fwdbwd else 1
            messages += (g - 1) * passes
        total += passes * (g - 1) * size
        remote += (g - 1) / g
    return total, messages, min(1.0, remote / max(1, len(s.segment_lengths)))


def framework_bytes(profile: HardwareProfile, mode: str) -> int:
    extra = profile.backward_overhead_gib if mode == "fwdbwd" else 0.0
    return int((profile.framework_overhead_gib + extra) * 2**30)


def plan(s: Shape, profile: HardwareProfile, devices: int | None = None) -> Plan:
    from .layers import LayerShape, estimate_layer_time, layer_memory

    devices = devices or s.world_size
    s = normalise(s.model_copy(update={"world_size": devices}))
    device_type = "cpu" if profile.kind == "cpu" else "cuda"
    layered = isinstance(s, LayerShape)
    try:
        if layered and devices > 1:
            raise ValueError(f"--target {s.target} is planned on one device; --devices {devices} applies to attention")
        memory = (layer_memory if layered else estimate_memory)(s, framework_bytes(profile, s.mode), device_type)
    except ValueError as exc:
        empty = MemoryBreakdown(items={}, total=0)
        return Plan(shape=s, profile=profile.name, devices=devices, memory=empty, capacity_bytes=profile.memory_bytes,
                    fits=False, time=None, feasible=False, reason=str(exc))
    capacity = profile.memory_bytes
    fits = memory.total <= capacity
    try:
        time = estimate_layer_time(s, profile) if layered else estimate_time(s, profile)
    except ValueError as exc:
        return Plan(shape=s, profile=profile.name, devices=devices, memory=memory, capacity_bytes=capacity, fits=fits,
                    time=None, feasible=False, reason=str(exc))
    if fits:
        reason = f"fits: {memory.total / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB per device"
    else:
        reason = f"does not fit: needs {memory.total / 2**30:.2f} GiB per device, has {capacity / 2**30:.2f} GiB"
    return Plan(shape=s, profile=profile.name, devices=devices, memory=memory, capacity_bytes=capacity, fits=fits,
                time=time, feasible=fits, reason=reason)


def _granule(s: Shape, devices: int) -> int:
    """N must be a multiple of this for the plan to be valid (shards aligned with segments)."""
    import math

    step = devices
    if s.impl not in DENSE and devices > 1 and strategy_for(s.impl, devices) in ("ring", "allgather"):
        for w in s.segment_lengths:
            step = math.lcm(step, w if w % devices == 0 else w * devices)
    return step


def max_seq(s: Shape, profile: HardwareProfile, devices: int = 1) -> tuple[int, Plan | None]:
    """Largest N (a multiple of the alignment granule) whose plan fits on `devices` devices; (0, None)
    if none does. Memory grows monotonically with N, so doubling then bisection finds it."""
    granule = _granule(s, devices)

    def fits(n: int) -> Plan | None:
        p = plan(s.model_copy(update={"seq_len": n}), profile, devices)
        return p if p.fits else None

    lo, hi = 0, granule
    best = None
    while True:
        p = fits(hi)
        if p is None:
            break
        lo, best = hi, p
        hi *= 2
        if hi > 2**40:
            break
    while hi - lo > granule:
        mid = (lo + hi) // 2 // granule * granule
        if mid <= lo:
            break
        p = fits(mid)
        if p is not None:
            lo, best = mid, p
        else:
            hi = mid
    return lo, best


def min_devices(s: Shape, profile: HardwareProfile, limit: int = 1 << 20) -> tuple[int | None, Plan | None]:
    """Fewest devices (powers of two, then refined) on which N fits; (None, None) if none up to `limit`."""
    d = 1
    while d <= limit:
        p = plan(s, profile, d)
        if p.fits:
            lo = d // 2
            for candidate in range(max(1, lo + 1), d + 1):
                if s.seq_len % candidate:
                    continue
                q = plan(s, profile, candidate)
                if q.fits:
                    return candidate, q
            return d, p
        d *= 2
    return None, None


def chunk_advice(s: Shape, profile: HardwareProfile, devices: int) -> str:
    """For ring strategies: the shard (chunk) length at which one ring step's transfer hides under its
    compute, from per-pair step compute vs step transfer time."""
    if strategy_for(s.impl, devices) != "ring" or devices < 2:
        return "no ring: chunk size does not apply"
    e = ELEMENT_BYTES[s.dtype]
    link = profile.intra_node if devices <= profile.devices_per_node else profile.inter_node
    peak = (profile.peak_flops(s.dtype) or 0) * profile.efficiency.compute_for(s.impl, s.mode)
    if peak <= 0:
        return "the profile has no rate for this dtype"
    worst = None
    spanning = {r for g, r, _ in spanning_pairs(s.model_copy(update={"world_size": devices}))}
    for w, r in zip(s.segment_lengths, s.dilation_rates):
        if r not in spanning:
            continue
        # one step: (L/r)² pairs per head (4·D flops each, x3.5 with backward) vs 2·(L/r)·H·D·e bytes:
        # compute grows with L², the transfer with L, so a step hides its transfer once L is large enough
        per_l2 = 4 * s.head_dim * s.batch * s.heads / r**2 * (FWD_BWD_FACTOR if s.mode == "fwdbwd" else 1) / peak
        per_l = 2 * s.batch * s.heads * s.head_dim * e / r / (link.bandwidth_gb_s * 1e9 * profile.efficiency.communication)
        threshold = per_l / per_l2 + (link.latency_us * 1e-6 / per_l2) ** 0.5
        if worst is None or threshold > worst[0]:
            worst = (threshold, w, r)
    if worst is None:
        return f"every segment fits in a shard of N/p = {s.seq_len // devices:,}: no ring traffic"
    threshold, w, r = worst
    verdict = "hidden" if s.seq_len // devices >= threshold else "exposed"
    return (f"the sparsest spanning pair (w={w}, r={r}) hides its ring transfer once N/p >= {int(threshold):,}; "
            f"here N/p = {s.seq_len // devices:,}: {verdict}")
