"""plan/layouts.py: pairs per rank are the exact counts, bytes per rank each kind's one formula, and `dattn plan`
renders the table (and --json) for a distributed problem, refusing impossible layouts in one line (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dattn_cli.kernels.distributed.hybrid import hybrid_comm_volume
from dattn_cli.kernels.distributed.shards import comm_volume
from dattn_cli.plan.layouts import layout_plan
from dattn_cli.workload import Problem

DENSE = dict(seq_len=64, segment_lengths=[64], dilation_rates=[1], heads=4, head_dim=8, causal=True)


def rows(plan):
    return {(r.kind, r.layout): r for r in plan.rows}


def test_dense_causal_p4_pairs_and_bytes():
    """Contiguous rank a: a·L² + L(L+1)/2 pairs per head; zigzag the same on every rank; ring bytes: the last
    member receives 3 buffers S = 2·B·L·H·D·e, zigzag every member; head-parallel 4·B·L·H·D·e·(p-1)/p."""
    plan = layout_plan(Problem(impl="RingDilatedAttention", world_size=4, **DENSE))
    by = rows(plan)
    shard, heads = 16, 4
    assert by["ring", "contiguous"].pairs == [heads * (a * shard * shard + shard * (shard + 1) // 2) for a in range(4)]
    assert by["ring", "contiguous"].planned and not by["ring", "zigzag"].planned
    assert len(set(by["ring", "zigzag"].pairs)) == 1 and by["ring", "zigzag"].balance == 1.0
    assert by["head_parallel", "contiguous"].balance == 1.0
    s = 2 * shard * heads * 8 * 4
    assert by["ring", "contiguous"].bytes_received == [0, s, 2 * s, 3 * s]
    assert by["ring", "zigzag"].bytes_received == [3 * s] * 4
    assert by["head_parallel", "contiguous"].bytes_sent == [4 * shard * heads * 8 * 4 * 3 // 4] * 4
    assert any(r.startswith("head_parallel/zigzag") for r in plan.refused)


def test_dense_causal_balance_is_175_at_length():
    by = rows(
        layout_plan(
            Problem(impl="RingDilatedAttention", world_size=4, **{**DENSE, "seq_len": 8192, "segment_lengths": [8192]})
        )
    )
    assert by["ring", "contiguous"].balance == pytest.approx(1.75, abs=1e-3)
    assert by["ring", "zigzag"].balance == 1.0


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
def test_bytes_are_the_kinds_formulas(mode):
    p = Problem(
        impl="HybridDilatedAttention", world_size=4, seq_len=256, heads=4, head_dim=8, segment_lengths=[64, 256],
        dilation_rates=[1, 2], causal=True, mode=mode, batch=2,
    )  # fmt: skip
    by = rows(layout_plan(p))
    shape = (2, 4, 8, 4, [64, 256], [1, 2], "longnet", True, False, None)
    keys = ("forward_bytes_sent", "backward_bytes_sent") if mode == "fwdbwd" else ("forward_bytes_sent",)
    for layout in ("contiguous", "zigzag"):
        for kind in ("ring", "allgather"):
            expected = [sum(c[k] for k in keys) for c in comm_volume(kind, 256, 4, *shape, layout)]
            assert by[kind, layout].bytes_sent == expected
        hybrid = hybrid_comm_volume(256, 4, 2, *shape, layout)
        assert by["hybrid", layout].bytes_sent == [sum(c[k] for k in keys) for c in hybrid]
        assert by["hybrid", layout].planned == (layout == "contiguous")
    total = p.spec.pairs(p)
    for row in by.values():  # every kind computes every pair once (block-sparse: its own block pattern)
        if row.kind != "block_sparse":
            assert sum(row.pairs) == total


def test_documents_layout_and_refusals():
    p = Problem(
        impl="RingDilatedAttention", world_size=4, seq_len=400, documents=[300, 50, 30, 20], causal=True,
        segment_lengths=[400], dilation_rates=[1], layout="documents", heads=2, head_dim=8,
    )  # fmt: skip
    by = rows(layout_plan(p))
    assert set(by) == {
        ("ring", "contiguous"),
        ("ring", "documents"),
        ("allgather", "contiguous"),
        ("allgather", "documents"),
    }
    assert by["ring", "documents"].balance < by["ring", "contiguous"].balance
    assert by["ring", "contiguous"].bytes_sent is None and by["ring", "documents"].sent_max > 0
    with pytest.raises(ValueError, match="--layout documents balances packed --documents"):
        Problem(impl="RingDilatedAttention", world_size=4, layout="documents")
    with pytest.raises(ValueError, match="--layout documents: HeadParallelDilatedAttention"):
        Problem(impl="HeadParallelDilatedAttention", world_size=2, seq_len=400, documents=[400], layout="documents")


def plan(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dattn_cli", "plan", "--impl", "RingDilatedAttention", "--world-size", "4", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli_renders_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    done = plan("--seq-len", "64", "--segments", "64", "--dilations", "1", "--causal", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "work and communication per rank" in done.stdout and "zigzag" in done.stdout
    layouts = json.loads(out.read_text())["layouts"]
    ring = next(r for r in layouts["rows"] if (r["kind"], r["layout"]) == ("ring", "contiguous"))
    assert ring["planned"] and ring["pairs"] == [8 * (a * 16 * 16 + 16 * 17 // 2) for a in range(4)]  # H = 8


def test_cli_refuses_documents_layout_without_documents():
    done = plan("--layout", "documents")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--documents" in done.stderr
