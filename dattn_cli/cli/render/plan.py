"""`dattn plan`: the plan's memory items, time and verdict; `plan --check`: predicted vs measured."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.table import Table

from .common import heads_label, literal, size

if TYPE_CHECKING:
    import pandas as pd

    from ...plan.layouts import LayoutPlan
    from ...plan.solve import Headroom, Plan

TIME_LABELS = {"attention": "time per call", "layer": "time per block call", "model": "time per training step"}


def _what(s) -> str:
    if s.target == "attention":
        return f"{literal(s.impl)} ({s.strategy})"
    options = ", ".join(
        o for o in ("checkpointing" if s.checkpointing else "", f"autocast {s.amp}" if s.amp else "") if o
    )
    if s.architecture is not None:
        return _named(s, options)
    depth = f"LongNetLM {s.layers} x " if s.target == "model" else ""
    return (
        f"{depth}DilatedTransformerBlock E={s.embed_dim} around {literal(s.impl)}"
        + (f" ({options})" if options else "")
        + (f", vocabulary {s.vocab_size:,}" if s.target == "model" else "")
    )


def _named(s, options: str) -> str:
    """A named model (plan --model, --model-config): its name, depth and block."""
    a = s.architecture
    depth = f"{s.layers} x " if s.target == "model" else "one "
    head = "tied" if a.tie_word_embeddings else "untied"
    return (
        f"{literal(a.name)}: {depth}{a.family} decoder layer E={s.embed_dim} F={a.intermediate_size} ({a.mlp}, "
        f"{a.norm}) around {literal(s.impl)}"
        + (f" ({options})" if options else "")
        + (f", vocabulary {s.vocab_size:,} ({head})" if s.target == "model" else "")
    )


def _model_rows(table: Table, result: Plan) -> None:
    """Where a named model comes from, and its parameter count (workload/architecture.py)."""
    from ...plan.layers import model_parameters

    s = result.problem
    table.add_row("model", literal(f"{s.architecture.name}, {model_parameters(s):,} parameters"))
    table.caption = literal(f"{s.architecture.name}: {s.architecture.source}")


def _ms(seconds: float, digits: int = 1) -> str:
    """Seconds as milliseconds; "n/a" for a figure that is not finite (it never reaches a table as 'inf ms')."""
    return f"{seconds * 1e3:,.{digits}f} ms" if math.isfinite(seconds) else "n/a"


def _time_rows(table: Table, result: Plan) -> None:
    s, t = result.problem, result.time
    table.add_section()
    table.add_row("FLOPs (docs/semantics.md convention)", f"{t.flops:.3e}")
    table.add_row("compute time", _ms(t.compute_s) + (f" ({literal(t.note)})" if s.target != "attention" else ""))
    if t.efficiency is not None:
        kernel = f"{t.kernel} kernel, " if t.kernel else ""
        table.add_row("attention efficiency (of peak)", f"{t.efficiency:.1%} ({kernel}{literal(t.efficiency_source)})")
    if t.memory_bytes:
        table.add_row("gather/merge memory traffic", f"{size(t.memory_bytes)}, {_ms(t.memory_s, 2)}")
    if s.target == "attention":
        table.add_row(f"communication ({t.link}, {t.messages} messages)", f"{size(t.comm_bytes)}, {_ms(t.comm_s, 2)}")
        table.add_row(
            "communication hidden under compute", ("yes" if t.comm_hidden else "no") + f" ({literal(t.note)})"
        )
    _step_rows(table, result)
    label = "time per forward" if s.target == "model" and s.mode == "fwd" else TIME_LABELS[s.target]
    table.add_row(f"[bold]{label}[/]", f"[bold]{_ms(t.total_s)}[/]")
    if (rate := result.throughput) is not None:
        table.add_row(
            f"per optimizer step ({rate.global_batch_tokens:,} tokens, {rate.accumulation} micro-step(s) a replica)",
            f"{_ms(rate.step_s)}; {rate.tokens_per_s_per_device:,.1f} tokens/s per device",
        )
        megatron = f", {rate.mfu_megatron:.1%} in Megatron's (full square, recompute)" if rate.mfu_megatron else ""
        table.add_row("MFU (plan/throughput.py)", f"{rate.mfu:.1%} causal-aware model FLOPs{megatron}")


def _step_rows(table: Table, result: Plan) -> None:
    """A model's training step over devices: each collective, its time and what of it is exposed, with the
    overlap assumed (plan/parallel.py), and the optimizer step."""
    t = result.time
    for c in getattr(t, "collectives", []):
        table.add_row(
            f"{literal(c.name)} ({c.link})",
            f"{size(c.bytes)}, {_ms(c.seconds, 2)}, exposed {_ms(c.exposed_s, 2)} ({literal(c.overlap)})",
        )
    if getattr(t, "optimizer_s", 0):
        table.add_row("optimizer step (memory-bound)", _ms(t.optimizer_s, 2))


def plan_table(result: Plan, solved: str | None, advice: str, room: Headroom | None = None) -> Table:
    s = result.problem
    title = (
        f"dattn plan: {_what(s)} on {result.devices} x {literal(result.profile)}, N={s.seq_len:,}, B={s.batch} "
        f"{heads_label(s.heads, s.kv_heads)} D={s.head_dim}, {s.dtype}, {s.mode}" + (", causal" if s.causal else "")
    )
    table = Table(title=title, show_header=True)
    table.add_column("item")
    table.add_column("per device", justify="right")
    if s.architecture is not None:
        _model_rows(table, result)
    if result.training is not None:
        table.add_row("layout", literal(result.training.describe()))
    if result.shard_len is not None:
        padded = result.shard_len * (result.training.sequence_parallel if result.training else result.devices)
        padding = f", N padded to {padded:,} (the padding masked)" if padded > s.seq_len else ""
        table.add_row("sequence shard", f"{result.shard_len:,} positions{padding}")
        table.add_section()
    for name, value in result.memory.items.items():
        table.add_row(literal(name), size(value))
    table.add_section()
    phase = getattr(result.memory, "phase", None)
    table.add_row(
        "[bold]peak memory[/]" + (f" (during: {phase})" if phase else ""),
        f"[bold]{size(result.memory.total)}[/] of {size(result.capacity_bytes)}",
    )
    if result.reserved_bytes is not None:
        from ...plan.memory import ALLOCATOR_MARGIN

        table.add_row(
            f"reserved at the peak (allocator margin {ALLOCATOR_MARGIN:.0%}, stated)", size(result.reserved_bytes)
        )
    if result.host_bytes is not None:
        table.add_row("host memory per node (offloaded, plan/offload.py)", size(result.host_bytes))
    if result.time is not None:
        _time_rows(table, result)
    table.add_section()
    verdict = "[green]feasible[/]" if result.feasible else "[red]infeasible[/]"
    table.add_row("verdict", f"{verdict}: {literal(result.reason)}")
    if room is not None:
        table.add_row("headroom", literal(headroom_text(result, room)))
    if solved:
        table.add_row("solver", literal(solved))
    if s.target == "attention" or (result.training and result.training.sequence_parallel > 1):
        table.add_row("ring chunk advice", literal(advice))
    return table


def headroom_text(result: Plan, room: Headroom) -> str:
    s = result.problem
    free = f"{size(room.free_bytes)} free" if room.free_bytes >= 0 else f"over by {size(-room.free_bytes)}"
    if s.documents is not None:
        return f"{free}; packed documents fix N and batch 1"
    seq = _largest("N", f"batch {s.batch}", room.largest_seq_len, "the search cap" if room.seq_len_capped else "")
    batch = _largest("batch", f"N={s.seq_len:,}", room.largest_batch, "the cap" if room.batch_capped else "")
    return f"{free}; {seq}; {batch}"


def _largest(what: str, at: str, value: int | None, cap: str) -> str:
    if value is None:
        return f"no {what} fits at {at}"
    return f"largest {what} at {at}: {value:,}" + (f" ({cap})" if cap else "")


def _pct(v) -> str:
    return "-" if v is None or v != v else f"{v:+.1f}%"


def check_table(frame: pd.DataFrame, profile: str, stats: dict) -> Table:
    med, worst = stats["mem_error_pct_median_abs"], stats["mem_error_pct_max_abs"]
    tmed, tworst = stats["time_error_pct_median_abs"], stats["time_error_pct_max_abs"]
    profile = literal(profile)
    title = (
        f"dattn plan --check against {profile}: memory error median {med:.1f}% max {worst:.1f}%; "
        f"time error median {tmed:.1f}% max {tworst:.1f}%"
        if med is not None and tmed is not None
        else f"dattn plan --check against {profile}"
    )
    table = Table(title=title)
    layered = "target" in frame and any(t != "attention" for t in frame["target"])
    columns = (
        ("impl",)
        + ("target",) * layered
        + ("N", "mode", "p", "measured mem", "predicted mem", "mem err", "measured ms", "predicted ms", "time err")
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("impl", "target", "mode") else "right", overflow="fold")
    for r in frame.to_dict(orient="records"):
        table.add_row(
            literal(r["impl"]),
            *([literal(r["target"])] if layered else []),
            str(r["seq_len"]),
            literal(r["mode"]),
            str(r["world_size"]),
            size(r["measured_mem_bytes"]),
            size(r["predicted_mem_bytes"]),
            _pct(r["mem_error_pct"]),
            f"{r['measured_ms']:,.1f}" if r["measured_ms"] else "-",
            f"{r['predicted_ms']:,.1f}" if r["predicted_ms"] else "-",
            _pct(r["time_error_pct"]),
        )
    return table


def layout_table(plan: LayoutPlan) -> Table:
    """Each distributed kind under each layout: pairs per rank (max, mean, max/mean) and bytes per rank per call."""
    per = "fwd+bwd" if plan.mode == "fwdbwd" else "fwd"
    table = Table(title=f"work and communication per rank, {plan.world_size} ranks, per {per} call", show_header=True)
    for column in ("kind", "layout", "pairs max", "pairs mean", "max/mean", "sent max", "received max", "note"):
        table.add_column(column, justify="left" if column in ("kind", "layout", "note") else "right")
    for r in plan.rows:
        mark = "*" if r.planned else ""
        table.add_row(
            f"{mark}{r.kind}",
            r.layout,
            f"{r.pairs_max:,}" if r.pairs_max is not None else "-",
            f"{r.pairs_mean:,.0f}" if r.pairs_mean is not None else "-",
            f"{r.balance:.3f}" if r.balance is not None else "-",
            size(r.sent_max) if r.sent_max is not None else "-",
            size(r.received_max) if r.received_max is not None else "-",
            literal(r.note),
        )
    refused = ", ".join(literal(why.split(":")[0]) for why in plan.refused)
    table.caption = "* the planned kind and layout" + (f"; not applicable (why: --json): {refused}" if refused else "")
    return table
