"""`dattn plan --search`: the layouts that fit, ranked by tokens/s per device at the global batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import size

if TYPE_CHECKING:
    from ...plan.search import Ranked, SearchResult

MFU_NOTE = (
    "MFU: causal-aware model FLOPs (the attention pairs the mask keeps; no recompute) over the step x the compute "
    "dtype's dense peak. MFU (Megatron): Megatron's convention, which NeMo and ALST report in: the full N x N "
    "attention square and the recomputed forward counted (plan/throughput.py)."
)


def shown(result: SearchResult, top: int) -> list[tuple[int, Ranked]]:
    """The first `top` layouts, then the best of each sequence-parallel kind (and none) not among them."""
    rows = list(enumerate(result.ranked[:top], 1))
    kinds = {r.layout.sp_kind for _, r in rows}
    for i, r in enumerate(result.ranked[top:], top + 1):
        if r.layout.sp_kind not in kinds:
            kinds.add(r.layout.sp_kind)
            rows.append((i, r))
    return rows


def search_table(result: SearchResult, title: str, top: int = 10) -> Table:
    table = Table(title=title, caption=_caption(result), show_header=True)
    for name, justify in (
        ("#", "right"),
        ("layout", "left"),
        ("tokens/s/GPU", "right"),
        ("MFU", "right"),
        ("MFU (Megatron)", "right"),
        ("peak", "right"),
        ("why it loses to #1", "left"),
    ):
        table.add_column(name, justify=justify)
    for rank, r in shown(result, top):
        table.add_row(
            str(rank),
            r.layout.describe(),
            f"{r.tokens_per_s_per_device:,.0f}",
            f"{r.mfu:.1%}",
            f"{r.mfu_megatron:.1%}" if r.mfu_megatron is not None else "-",
            size(r.peak_bytes),
            r.why or "-",
        )
    return table


def _caption(result: SearchResult) -> str:
    fit = len(result.ranked)
    return (
        f"{result.considered:,} layouts planned: {fit:,} fit, {result.not_fitting:,} over the device's memory or the "
        f"global batch, {result.refused:,} refused by the planner (a reason each: plan one to see it). {MFU_NOTE}"
    )
