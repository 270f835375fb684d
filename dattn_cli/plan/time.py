"""Time of one attention call per device on a hardware profile (the planner's time model).

* compute   = FLOPs / (peak[dtype] x efficiency); FLOPs by workload/counts.py (4·D·P forward, P = attended
              pairs this device computes; fwd+bwd = 3.5 x), efficiency per implementation from the
              profile (`plan --calibrate` fits it)
* comm      = Σ messages (latency + bytes / (bandwidth x efficiency)); the link is intra-node while the
              group fits in `devices_per_node`, else inter-node; bytes from workload/counts.py
* ring overlap: each ring step's transfer hides under the previous step's compute when
              step compute time >= step transfer time; total = compute + max(0, comm - overlappable)
"""

from __future__ import annotations

from pydantic import BaseModel

from ..workload.counts import flops_per_device, head_parallel_traffic, sequence_parallel_traffic
from ..workload.problem import Problem
from .profiles import HardwareProfile


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


def estimate_time(s: Problem, profile: HardwareProfile) -> TimeBreakdown:
    peak = profile.peak_flops(s.dtype)
    if peak is None:
        raise ValueError(f"profile {profile.name!r} has no {s.dtype} rate (null in its peak_tflops): pick another --dtype")
    flops = flops_per_device(s)
    compute = flops / (peak * profile.efficiency.compute_for(s.impl, s.mode))
    p = s.world_size
    link = profile.intra_node if p <= profile.devices_per_node else profile.inter_node
    link_name = "intra-node" if p <= profile.devices_per_node else "inter-node"
    comm_bytes, messages, overlappable, note = 0, 0, 0.0, "single device: no communication"
    if p > 1 and s.strategy in ("ring", "allgather"):
        comm_bytes, messages, steps_share = sequence_parallel_traffic(s)
        # the remote blocks' compute is what a ring transfer can hide under
        overlappable = compute * steps_share if s.strategy == "ring" else 0.0
        note = ("ring: per step, transfer vs compute of the previous block" if s.strategy == "ring"
                else "all-gather: a collective before the remote blocks, not overlapped")
    elif p > 1 and s.strategy == "head_parallel":
        comm_bytes, messages = head_parallel_traffic(s)
        note = "head-parallel: all-to-alls before and after attention, not overlapped"
    comm = messages * link.latency_us * 1e-6 + comm_bytes / (link.bandwidth_gb_s * 1e9 * profile.efficiency.communication)
    hidden = comm <= overlappable if messages else True
    total = compute + max(0.0, comm - overlappable)
    return TimeBreakdown(flops=flops, compute_s=compute, comm_bytes=comm_bytes, messages=messages, comm_s=comm,
                         overlappable_s=overlappable, comm_hidden=hidden, total_s=total, link=link_name, note=note)
