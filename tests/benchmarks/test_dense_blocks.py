"""benchmarks/dense_blocks.py: every kernel's figure in the row, the ratio against the fastest, a profile per N."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import dense_blocks  # noqa: E402


def test_a_cpu_row_names_every_kernel_and_the_fastest(tmp_path):
    args = argparse.Namespace(
        device="cpu", dtype="float32", mode="fwdbwd", causal=False, batch=1, heads=2, head_dim=16,
        segments=[128, 256], dilations=[1, 2], repeat=1, warmup=0, trace=str(tmp_path),
        kernels=list(dense_blocks.KERNELS),
    )  # fmt: skip
    row = dense_blocks.measure(args, 512)
    for kernel in ["backend", *dense_blocks.KERNELS]:
        assert f"{kernel}_blocks_tflops" in row
    assert row["backend_blocks_tflops"] > 0 and row["sdpa_default_blocks_tflops"] > 0
    assert row["cudnn_blocks_error"] == "not measured on cpu" and row["fa4_blocks_tflops"] is None
    ran = {k: row[f"{k}_blocks_tflops"] for k in ("backend", "sdpa_default", "efficient") if row[f"{k}_blocks_tflops"]}
    assert row["fastest_kernel"] == max(ran, key=ran.get)
    assert row["ratio_vs_fastest"] == row["module_tflops"] / max(ran.values())
    assert "Self CPU" in Path(row["trace"]).read_text()
    assert row["block_kernel"] == "cpu-flash" and 0 < row["module_host_ms"]
    assert row["module_accumulating_ms"] > 0 and "DATTN_FUSED_MERGE" not in dense_blocks.os.environ


def test_fastest_is_taken_among_cudnn_fa4_and_fa2_when_they_ran():
    row = {"module_tflops": 100.0, "backend_blocks_tflops": 300.0, "sdpa_default_blocks_tflops": 500.0}
    row |= {"cudnn_blocks_tflops": 400.0, "fa2_blocks_tflops": 250.0, "fa4_blocks_tflops": None}
    figures = dense_blocks.ratios(row)
    assert figures["fastest_kernel"] == "cudnn" and figures["fastest_of"] == ["cudnn", "fa2"]
    assert figures["ratio_vs_fastest"] == 0.25 and figures["ratio_vs_sdpa_default"] == 0.2
