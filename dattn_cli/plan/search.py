"""plan --search: every layout of a model's training over `devices` that the planner can plan, those that fit
ranked by tokens/s per device at the global batch (plan/throughput.py).

A layout: tensor parallel T (powers of two dividing the query and kv heads, inside a node), the sequence-parallel
kind (ring, allgather, head_parallel, hybrid; the ring, all-gather and hybrid on zigzag shards, which balance the
causal work) and degree C (powers of two, T x C dividing
the devices), the ZeRO stage (0-3), recompute (none, selective, full), loss (standard, chunked) and offload (none,
the optimizer, the checkpointed activations, both; only on a profile with a host section). A layout fits when its
peak fits the device and its replicas' micro-step is no more than the global batch. Each loser's line says how
much of the winner's tokens/s it loses and where its step's time per token goes beyond the winner's: attention,
the linear layers (recomputation shows here), exposed communication, the optimizer step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from pydantic import BaseModel

from ..workload.problem import Problem
from . import context
from .parallel import Training
from .profiles import HardwareProfile

KINDS = ("ring", "allgather", "head_parallel", "hybrid")
OFFLOADS: tuple[tuple[str, ...], ...] = ((), ("optimizer",), ("activations",), ("activations", "optimizer"))


class Layout(BaseModel):
    tensor_parallel: int
    sequence_parallel: int
    sp_kind: str | None
    zero: int
    recompute: str
    loss: str
    offload: tuple[str, ...]

    def describe(self) -> str:
        sp = f"sp {self.sequence_parallel} {self.sp_kind}" if self.sequence_parallel > 1 else "sp 1"
        off = "+".join(self.offload) or "-"
        return (
            f"tp {self.tensor_parallel}, {sp}, zero {self.zero}, recompute {self.recompute}, loss {self.loss}, "
            f"offload {off}"
        )


class Ranked(BaseModel):
    layout: Layout
    peak_bytes: int
    reserved_bytes: int | None
    tokens_per_s_per_device: float
    mfu: float
    mfu_megatron: float | None
    step_s: float
    accumulation: int
    seconds_per_token: dict[str, float]  # a device's step time per token, by where it goes
    why: str = ""  # what it loses to the first, and where


class SearchResult(BaseModel):
    profile: str
    devices: int
    global_batch_tokens: int
    considered: int  # layouts planned
    refused: int  # the planner refused them (a reason each, not shown)
    not_fitting: int  # planned, but over the device's memory or the global batch
    ranked: list[Ranked]


def layouts(s: Problem, devices: int, per_node: int, host: bool) -> Iterator[Layout]:
    """Every layout of the module docstring for `s` over `devices`."""
    powers = [1 << i for i in range(devices.bit_length()) if devices % (1 << i) == 0]
    tps = [t for t in powers if t <= per_node and s.heads % t == 0 and s.kv_head_count % t == 0]
    offloads = OFFLOADS if host else ((),)
    for tp in tps:
        for sp in (p for p in powers if devices % (tp * p) == 0 and s.seq_len % (tp * p) == 0):
            for kind, zero, recompute, loss, off in itertools.product(
                KINDS if sp > 1 else (None,),
                (0, 1, 2, 3),
                ("none", "selective", "full"),
                ("standard", "chunked"),
                offloads,
            ):
                if ("activations" in off and recompute != "full") or ("optimizer" in off and zero == 0):
                    continue
                yield Layout(
                    tensor_parallel=tp,
                    sequence_parallel=sp,
                    sp_kind=kind,
                    zero=zero,
                    recompute=recompute,
                    loss=loss,
                    offload=off,
                )


def layout_problem(s: Problem, layout: Layout) -> Problem:
    """`s` as `layout` plans it: its kind, its recompute, and the ring kinds on zigzag shards (balanced)."""
    split = layout.sp_kind in context.STEPPED
    update = {"sp_kind": layout.sp_kind, "checkpointing": layout.recompute == "full"}
    return s.model_copy(update={**update, "layout": "zigzag" if split else "contiguous"})


def _ranked(layout: Layout, result) -> Ranked:
    rate, time = result.throughput, result.time
    per_token = rate.accumulation / (rate.tokens_per_s_per_device * rate.step_s)  # 1 / a device's tokens a micro-step
    linear = time.compute_s - time.attention_s
    return Ranked(
        layout=layout,
        peak_bytes=result.memory.total,
        reserved_bytes=result.reserved_bytes,
        tokens_per_s_per_device=rate.tokens_per_s_per_device,
        mfu=rate.mfu,
        mfu_megatron=rate.mfu_megatron,
        step_s=rate.step_s,
        accumulation=rate.accumulation,
        seconds_per_token={
            "attention": time.attention_s * per_token,
            "linear layers": linear * per_token,
            "exposed communication": time.exposed_s * per_token,
            "optimizer step": time.optimizer_s / rate.accumulation * per_token,
        },
    )


def why(row: Ranked, best: Ranked) -> str:
    """What `row` loses to `best` and where its time per token goes beyond the winner's."""
    loss = 1 - row.tokens_per_s_per_device / best.tokens_per_s_per_device
    total = sum(best.seconds_per_token.values())
    extra = sorted(
        ((k, v - best.seconds_per_token[k]) for k, v in row.seconds_per_token.items()), key=lambda kv: -kv[1]
    )
    parts = [f"{k} {d / total:+.0%}" for k, d in extra if d > 0.005 * total][:2]
    hints = []
    if row.layout.sp_kind in context.STEPPED and best.layout.sp_kind == "head_parallel":
        hints.append(
            f"its {row.layout.sp_kind} split runs attention at {context.CP_ATTENTION_EFFICIENCY:g} of the kernel's rate"
        )
    if row.layout.recompute == "full" and best.layout.recompute != "full":
        hints.append("full recompute runs each block's forward again")
    if not parts:
        if loss < 0.0005:
            return "as fast as #1; ranked after it by peak memory"
        return f"{loss:.1%} fewer tokens/s than #1: no part of its step is 0.5% of #1's time per token longer"
    why = f"{loss:.1%} fewer tokens/s than #1: {', '.join(parts)} of #1's time per token"
    return why + (f" ({'; '.join(hints)})" if hints else "")


def search(
    s: Problem,
    profile: HardwareProfile,
    devices: int,
    global_batch_tokens: int,
    plan: Callable,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Plan every layout (`plan(problem, profile, training=...)`: solve.plan) and rank those that fit."""
    candidates = list(layouts(s, devices, profile.devices_per_node, profile.host is not None))
    ranked, refused, not_fitting = [], 0, 0
    for i, layout in enumerate(candidates):
        if progress is not None:
            progress(i, len(candidates))
        problem = layout_problem(s, layout)
        try:
            training = Training(
                devices=devices,
                global_batch_tokens=global_batch_tokens,
                **layout.model_dump(exclude={"sp_kind"}),
            )
            result = plan(problem, profile, training=training)
        except ValueError:
            refused += 1
            continue
        if result.time is None or result.throughput is None:  # the planner refused it (its reason in result.reason)
            refused += 1
            continue
        if not result.feasible or result.throughput.global_batch_tokens > global_batch_tokens:
            not_fitting += 1  # over the device's (or host's) memory, or one micro-step is over the global batch
            continue
        ranked.append(_ranked(layout, result))
    ranked.sort(key=lambda r: (-r.tokens_per_s_per_device, r.peak_bytes))
    for row in ranked[1:]:
        row.why = why(row, ranked[0])
    return SearchResult(
        profile=profile.name,
        devices=devices,
        global_batch_tokens=global_batch_tokens,
        considered=len(candidates),
        refused=refused,
        not_fitting=not_fitting,
        ranked=ranked,
    )
