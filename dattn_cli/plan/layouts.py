"""Work and communication per rank of each distributed kind and shard layout (`dattn plan` on several ranks).

Work: the exact (query, key) pairs of the queries each rank computes (kernels/distributed/work.py), times the
batch. Bytes: each kind's one formula, per rank and per call (forward; fwdbwd: forward + backward):
ring and all-gather `shards.comm_volume`, head-parallel and hybrid `hybrid.hybrid_comm_volume` (head-parallel is
its h = p case), the block-sparse ring `BlockSparseRingDilatedAttention.comm_volume`, and layout="documents" the
zigzag `comm_volume` of each spread document at its padded length (document_layout.py). docs/communication.md
states the formulas and when each kind and layout wins.
"""

from __future__ import annotations

from pydantic import BaseModel

from ..kernels.distributed.shards import TRAFFIC_KEYS
from ..workload import Problem

KIND_IMPL = {
    "ring": "RingDilatedAttention",
    "allgather": "DistributedImprovedDilatedAttention",
    "head_parallel": "HeadParallelDilatedAttention",
    "hybrid": "HybridDilatedAttention",
    "block_sparse": "BlockSparseRingDilatedAttention",
}
MAX_COUNTED = 2**20  # positions counted one by one (work.py; 0.25 s a head share at 1M) beyond: work left out
MAX_TABLE_BLOCKS = 4096  # query blocks of the block-sparse row's table (blocks^2 entries): over it, the row is left out


class LayoutRow(BaseModel):
    """One kind under one layout: per-rank pairs and bytes (lists in rank order) and their max and mean."""

    kind: str
    layout: str
    planned: bool  # the planned problem's own kind and layout
    pairs: list[int] | None = None
    pairs_max: int | None = None
    pairs_mean: float | None = None
    balance: float | None = None  # pairs max/mean: 1.0 is perfect balance
    bytes_sent: list[int] | None = None
    bytes_received: list[int] | None = None
    sent_max: int | None = None
    received_max: int | None = None
    note: str = ""


class LayoutPlan(BaseModel):
    world_size: int
    mode: str
    rows: list[LayoutRow]
    refused: list[str]  # "kind/layout: why" for the combinations this problem cannot take


def _variant(p: Problem, kind: str, layout: str) -> Problem:
    """The problem as `kind` would run it under `layout`, or a ValueError naming why it cannot."""
    impl = KIND_IMPL[kind]
    if p.spec.strategy == kind:
        impl = p.impl
    return p.with_(impl=impl, layout=layout, head_parallel_size=p.head_parallel_size if kind == "hybrid" else None)


def _per_call(counts: list[dict[str, int]], mode: str) -> tuple[list[int], list[int]]:
    """(sent, received) per rank for one call: forward, plus backward for fwdbwd."""
    keys = TRAFFIC_KEYS if mode == "fwdbwd" else TRAFFIC_KEYS[:2]
    sent = [sum(c[k] for k in keys if k.endswith("sent")) for c in counts]
    return sent, [sum(c[k] for k in keys if k.endswith("received")) for c in counts]


def _padded(v: Problem) -> int:
    from ..kernels.registry import shard_length

    return shard_length(v, v.world_size) * v.world_size


def _bytes(v: Problem, kind: str) -> list[dict[str, int]]:
    from ..kernels.distributed.hybrid import hybrid_comm_volume
    from ..kernels.distributed.shards import comm_volume

    world, n = v.world_size, _padded(v)
    shape = (v.batch, v.heads, v.head_dim, v.element_bytes, v.segment_lengths, v.dilation_rates, v.semantics)
    kv = v.kv_heads
    if kind in ("ring", "allgather"):
        return comm_volume(kind, n, world, *shape, v.causal, False, kv, v.layout)
    if kind in ("head_parallel", "hybrid"):
        h = world if kind == "head_parallel" else v.hybrid_size
        return hybrid_comm_volume(n, world, h, *shape, v.causal, False, kv, v.layout)
    module = _block_module(v)
    return [
        module.comm_volume(v.seq_len, v.heads, v.head_dim, v.batch, v.element_bytes, v.causal, False, n, kv, (r, world))
        for r in range(world)
    ]


def _block_module(v: Problem):
    from ..kernels.block_sparse.attention import BlockSparseRingDilatedAttention

    return BlockSparseRingDilatedAttention(**v.block_options(), semantics=v.semantics, layout=v.layout)


def _positions(v: Problem, world: int, n: int):
    import torch

    from ..kernels.distributed.layout import rank_positions

    return torch.stack([rank_positions(r, world, n // world, v.layout) for r in range(world)])


def _work(v: Problem, kind: str) -> list[int]:
    """Pairs per rank (times the batch) of `kind` under v.layout."""
    from ..kernels.distributed.work import block_pairs_per_position, pairs_per_position, rank_work

    world, n = v.world_size, _padded(v)
    pattern = (v.segment_lengths, v.dilation_rates, v.heads, v.semantics, v.causal)
    if kind == "block_sparse":
        table = _block_module(v)._padded_table(v.seq_len, n, v.heads)
        work = rank_work(block_pairs_per_position(table, v.block_size, v.heads, v.causal), _positions(v, world, n))
    elif kind in ("head_parallel", "hybrid"):
        h = world if kind == "head_parallel" else v.hybrid_size
        ring = world // h
        shares = v.heads // h
        positions = _positions(v, ring, n)  # ring shard b: the positions block b's ranks attend
        by_share = [
            rank_work(pairs_per_position(v.seq_len, *pattern, (j * shares, (j + 1) * shares)), positions)
            for j in range(h)
        ]
        work = [int(by_share[j][b]) for b in range(ring) for j in range(h)]  # rank b·h + j
    else:
        work = rank_work(pairs_per_position(v.seq_len, *pattern), _positions(v, world, n))
    return [int(w) * v.batch for w in work]


def _document_row(v: Problem, kind: str) -> tuple[list[int], list[dict[str, int]] | None, str]:
    """(pairs, bytes or None, note) of packed documents: whole documents locally, the layout's spread ones through
    the zigzag form of `kind`; contiguous shards' crossing documents are all-gathered (bytes not modelled here)."""
    import torch

    from ..kernels.distributed.document_layout import document_layout
    from ..kernels.distributed.shards import comm_volume
    from ..kernels.distributed.work import document_pairs_per_position, rank_work
    from ..kernels.documents import offsets

    world, total = v.world_size, v.seq_len
    per = document_pairs_per_position(v.documents, v.segment_lengths, v.dilation_rates, v.heads, v.semantics, v.causal)
    if v.layout == "contiguous":
        shard = -(-total // world)
        positions = torch.arange(world * shard).view(world, shard)
        note = "pairs of its own rows (crossing documents are computed whole): bytes not modelled"
        return [int(w) * v.batch for w in rank_work(per, positions)], None, note
    layout = document_layout(offsets(v.documents), world, v.segment_lengths)
    shape = (v.batch, v.heads, v.head_dim, v.element_bytes, v.segment_lengths, v.dilation_rates, v.semantics)
    counts = [dict.fromkeys(TRAFFIC_KEYS, 0) for _ in range(world)]
    for _, _, padded in layout.spread:
        spread = comm_volume(kind, padded, world, *shape, v.causal, False, v.kv_heads, "zigzag")
        counts = [{k: c[k] + s[k] for k in TRAFFIC_KEYS} for c, s in zip(counts, spread)]
    note = f"{len(layout.spread)} document(s) spread over every rank"
    return [int(w) * v.batch for w in rank_work(per, layout.positions)], counts, note


def _row(p: Problem, v: Problem, kind: str) -> LayoutRow:
    note = ""
    planned = p.spec.strategy == kind and p.layout == v.layout
    if kind == "block_sparse" and (blocks := -(-_padded(v) // v.block_size)) > MAX_TABLE_BLOCKS:
        # its pairs and bytes come from the block table, blocks^2 entries: 1G at 4M tokens took 19 GB and minutes
        note = f"{blocks:,} blocks: the block table is built up to {MAX_TABLE_BLOCKS:,}"
        return LayoutRow(kind=kind, layout=v.layout, planned=planned, note=note)
    if v.documents is not None:
        pairs, counts, note = _document_row(v, kind)
    else:
        counted = _padded(v) <= MAX_COUNTED
        pairs = _work(v, kind) if counted else None
        counts = _bytes(v, kind)
        note = "" if counted else f"N' over {MAX_COUNTED:,}: pairs not counted"
    sent, received = _per_call(counts, v.mode) if counts is not None else (None, None)
    mean = sum(pairs) / len(pairs) if pairs else None
    return LayoutRow(
        kind=kind,
        layout=v.layout,
        planned=planned,
        pairs=pairs,
        pairs_max=max(pairs) if pairs else None,
        pairs_mean=mean,
        balance=max(pairs) / mean if mean else None,
        bytes_sent=sent,
        bytes_received=received,
        sent_max=max(sent) if sent else None,
        received_max=max(received) if received else None,
        note=note,
    )


def _reason(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError: its first error's sentence
    return errors()[0]["msg"].removeprefix("Value error, ") if errors else str(exc)


def layout_plan(p: Problem) -> LayoutPlan:
    """Every distributed kind under the layouts it can take for this problem (contiguous and zigzag; contiguous and
    documents with packed documents), side by side; combinations it cannot take are listed with why."""
    if p.world_size < 2 or not p.spec.distributed or p.target != "attention":
        raise ValueError("the layout table is for --target attention with a distributed --impl and --world-size >= 2")
    layouts = ("contiguous", "documents") if p.documents is not None else ("contiguous", "zigzag")
    rows, refused = [], []
    for kind in KIND_IMPL:
        for layout in layouts:
            try:
                variant = _variant(p, kind, layout)
            except ValueError as exc:
                refused.append(f"{kind}/{layout}: {_reason(exc)}")
                continue
            if variant.documents is not None and kind not in ("ring", "allgather"):
                refused.append(f"{kind}/{layout}: packed documents are planned for the ring and all-gather")
                continue
            rows.append(_row(p, variant, kind))
    return LayoutPlan(world_size=p.world_size, mode=p.mode, rows=rows, refused=refused)
