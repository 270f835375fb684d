"""The collectives of a training step and what of each is exposed (docs/plan.md, "Whole-model plans across
devices"): data parallel (DDP's all-reduce, ZeRO's reduce-scatter and all-gather, FSDP's per-unit gathers) and
tensor parallel (Megatron's all-gathers and reduce-scatters around each block's column- and row-parallel linears).

Ring algorithms, bytes each device sends in NCCL's bus-bandwidth convention (nccl-tests doc/PERFORMANCE.md):
all-reduce 2(n-1)/n·G, all-gather and reduce-scatter (n-1)/n·G, over a group of n devices, at the link of the span
the group crosses (plan/parallel.py's placement: tensor parallel innermost, data parallel across every device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from ..workload.problem import ELEMENT_BYTES, Problem
from .profiles import HardwareProfile

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default


class Collective(BaseModel):
    name: str
    bytes: int  # sent per device
    seconds: float
    exposed_s: float  # the part not hidden under compute
    overlap: str  # the overlap assumption
    link: str = "intra-node"


@dataclass(frozen=True)
class Group:
    """A group of `size` devices whose members lie within `span` consecutive ranks (the link it crosses)."""

    size: int
    span: int


@dataclass(frozen=True)
class Sharded:
    """One device's parameter bytes as the data-parallel collectives move them: all of them, the largest FSDP unit,
    and all of them as all-gathered (torchao's float8 all-gather: less)."""

    total: float
    unit: float
    gathered: float


def timed(
    name: str, nbytes: float, messages: int, profile: HardwareProfile, group: Group, overlap: str, exposed: Callable
) -> Collective:
    """One collective over `group`; `exposed(seconds)` is the part of its time not hidden under compute."""
    seconds = profile.transfer_seconds(group.span, messages, nbytes)
    link = profile.link(group.span)[0]
    return Collective(
        name=name, bytes=int(nbytes), seconds=seconds, exposed_s=exposed(seconds), overlap=overlap, link=link
    )


def _ddp_all_reduce(total: float, profile: HardwareProfile, group: Group, backward_s: float) -> Collective:
    n = group.size
    share = (n - 1) / n
    buckets = max(1, -(-int(total) // DDP_BUCKET_BYTES))
    last = profile.transfer_seconds(group.span, 2 * (n - 1), 2 * share * min(total, DDP_BUCKET_BYTES))
    overlap = (
        "25 MiB buckets all-reduced during the backward; what exceeds the backward compute and the last bucket "
        "are exposed"
    )
    exposed = lambda sec: max(0.0, sec - backward_s) + last
    return timed(
        "DDP all-reduce of gradients", 2 * share * total, buckets * 2 * (n - 1), profile, group, overlap, exposed
    )


def replicate_all_reduce(
    profile: HardwareProfile, groups: Group, params: Sharded, shards: int, backward_s: float
) -> Collective:
    """HSDP (FSDP2's hybrid shard, torchtitan's data_parallel_replicate_degree): each unit's gradient shard,
    reduce-scattered within its shard group, all-reduced across the `groups.size` groups holding copies, during the
    backward; what exceeds the backward and the last unit's are exposed."""
    n = groups.size
    share = 2 * (n - 1) / n
    last = profile.transfer_seconds(groups.span, 2 * (n - 1), share * params.unit / shards)
    return timed(
        f"HSDP all-reduce of gradient shards across {n} copies",
        share * params.total / shards,
        2 * (n - 1),
        profile,
        groups,
        "per unit during the backward, after its reduce-scatter; what exceeds the backward and the last unit exposed",
        lambda sec: max(0.0, sec - backward_s) + last,
    )


def data_parallel(
    s: Problem, profile: HardwareProfile, zero: int, group: Group, params: Sharded, passes: tuple[float, float]
) -> list[Collective]:
    """The gradient and parameter collectives of one step over the data-parallel `group` (the devices sharing one
    tensor-parallel shard); `passes`: the forward and backward compute seconds they may hide under."""
    (forward_s, backward_s), n = passes, group.size
    if n == 1 or (s.mode != "fwdbwd" and zero != 3):
        return []
    if s.mode == "fwdbwd" and zero == 0:
        return [_ddp_all_reduce(params.total, profile, group, backward_s)]
    share = (n - 1) / n
    messages = (s.layers + 1) * (n - 1)  # one collective per unit: every block, and the embedding/head
    unit = profile.transfer_seconds(group.span, n - 1, share * params.unit)

    def run(name: str, overlap: str, exposed: Callable, nbytes: float = params.total) -> Collective:
        return timed(name, share * nbytes, messages, profile, group, overlap, exposed)

    if zero < 3:  # ZeRO-1/2: gradients reduce-scattered during the backward, updated parameters all-gathered after
        return [
            run(
                "ZeRO reduce-scatter of gradients",
                "per unit during the backward; what exceeds the backward and the last unit exposed",
                lambda sec: max(0.0, sec - backward_s) + unit,
            ),
            run(
                "ZeRO all-gather of updated parameters",
                "after the optimizer step, nothing to hide under: exposed",
                lambda sec: sec,
            ),
        ]
    ahead = "prefetched one unit ahead under the forward; the first unit's gather exposed"
    out = [run("FSDP all-gather (forward)", ahead, lambda sec: max(0.0, sec - forward_s) + unit, params.gathered)]
    if s.mode != "fwdbwd":
        return out
    ahead = "prefetched one unit ahead under the backward"
    gather = run("FSDP all-gather (backward)", ahead, lambda sec: max(0.0, sec - backward_s), params.gathered)
    room = max(0.0, backward_s - gather.seconds)
    reduce = run(
        "FSDP reduce-scatter of gradients",
        "per unit under the backward compute left after the all-gathers; the last unit exposed",
        lambda sec: max(0.0, sec - room) + unit,
    )
    return [*out, gather, reduce]


def tensor_parallel(s: Problem, profile: HardwareProfile, tp: int, tokens: int, recompute: bool) -> list[Collective]:
    """Megatron's tensor parallelism with sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2):
    in each block's forward an all-gather of the sequence-sharded input before the attention's and the MLP's
    column-parallel linears and a reduce-scatter after their row-parallel ones, 2 + 2 of `tokens` x E in the compute
    dtype; the backward the same 2 + 2 (the gradients), on the critical path, and 2 all-gathers of the saved shards
    for the weight gradients, overlapped with the input gradients' matmuls; full recompute runs the forward's again."""
    if tp == 1:
        return []
    share, group = (tp - 1) / tp, Group(tp, tp)
    one = share * tokens * s.width * ELEMENT_BYTES[s.compute_dtype]
    forward = 4 * (2 if recompute else 1)
    critical = forward + (4 if s.mode == "fwdbwd" else 0)
    messages = s.layers * (tp - 1)
    out = [
        timed(
            f"tensor-parallel all-gathers and reduce-scatters ({s.layers} blocks)",
            critical * s.layers * one,
            critical * messages,
            profile,
            group,
            "between the blocks' matmuls, each waiting for the last: exposed",
            lambda sec: sec,
        )
    ]
    if s.mode == "fwdbwd":
        out.append(
            timed(
                f"tensor-parallel re-gathers for the weight gradients ({s.layers} blocks)",
                2 * s.layers * one,
                2 * messages,
                profile,
                group,
                "under the input gradients' matmuls: hidden",
                lambda sec: 0.0,
            )
        )
    return out
