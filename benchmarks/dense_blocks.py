"""ImprovedDilatedAttention against the dense kernel on the same blocks (issue 21, item 3).

For each N, the dilated module's fwd(+bwd) is timed, then the dense attention kernel alone on exactly the
blocks the module computes (kernels/pattern.py build_blocks: one (B*segments, heads, rows, D) problem per
block, made contiguous beforehand, so no gather or merge is timed). Both are charged the same FLOPs
(workload/counts.py: 4*D*pairs, x3.5 with backward), so

    ratio = dense-on-blocks time / dilated time = dilated TFLOP/s / dense-on-blocks TFLOP/s

is the share of the kernel's speed the module keeps after its gathers, merges and launches. Two dense
kernels are timed on the blocks: the backend the module used (its own call, returning the logsumexp) and
PyTorch's F.scaled_dot_product_attention with its default kernel choice (FlashAttention-2/cuDNN on
Hopper), the speed a faster block backend could reach. With --trace DIR, a torch.profiler table of the
module's call is written where the ratio is below --trace-below.

    python benchmarks/dense_blocks.py --device cuda --dtype bfloat16 --seq-len 65536,1048576 --out r.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dattn_cli.kernels import ImprovedDilatedAttention  # noqa: E402
from dattn_cli.kernels.backends import BACKENDS, BlockCall  # noqa: E402
from dattn_cli.kernels.pattern import build_blocks  # noqa: E402
from dattn_cli.workload.counts import FWD_BWD_FACTOR  # noqa: E402


def timed(fn, device: str, repeat: int, warmup: int) -> float:
    """Median seconds of fn() over `repeat` calls after `warmup` (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def block_inputs(blocks, batch, head_dim, dtype, device):
    """One contiguous (b, h, m, D) q, k, v and dout per block."""
    shapes = [(batch * b.num_segments, b.num_heads, b.rows, head_dim) for b in blocks]
    return [[torch.randn(s, dtype=dtype, device=device) for _ in range(4)] for s in shapes]


def dense_backend_step(name: str, inputs, causal: bool, backward: bool):
    backend = BACKENDS[name]

    def step():
        for q, k, v, dout in inputs:
            call = BlockCall(causal=causal, scale=q.shape[-1] ** -0.5)
            out, lse = backend.forward(q, k, v, None, call)
            if backward:
                backend.backward(dout, q, k, v, out, lse, None, call)

    return step


def dense_sdpa_step(inputs, causal: bool, backward: bool):
    leaves = [[x.requires_grad_(backward) for x in (q, k, v)] + [dout] for q, k, v, dout in inputs]

    def step():
        for q, k, v, dout in leaves:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if backward:
                torch.autograd.grad(out, (q, k, v), dout)

    return step


def module_step(module, x, causal: bool, backward: bool):
    q, k, v, dout = x

    def step():
        out = module(q, k, v, is_causal=causal)
        if backward:
            torch.autograd.grad(out, (q, k, v), dout)

    return step


def measure(args, seq_len: int) -> dict:
    dtype, device, backward = getattr(torch, args.dtype), args.device, args.mode == "fwdbwd"
    blocks = build_blocks(seq_len, args.heads, args.segments, args.dilations, "longnet")
    pairs = sum(b.pairs_attended(args.batch, args.causal) for b in blocks)
    flops = 4.0 * args.head_dim * pairs * (FWD_BWD_FACTOR if backward else 1.0)
    module = ImprovedDilatedAttention(args.segments, args.dilations)
    x = [torch.randn(args.batch, seq_len, args.heads, args.head_dim, dtype=dtype, device=device) for _ in range(4)]
    for t in x[:3]:
        t.requires_grad_(backward)
    row = {
        "seq_len": seq_len,
        "batch": args.batch,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "segments": args.segments,
        "dilations": args.dilations,
        "dtype": args.dtype,
        "mode": args.mode,
        "causal": args.causal,
        "device": device,
        "blocks": len(blocks),
        "flops": flops,
    }
    t_module = timed(module_step(module, x, args.causal, backward), device, args.repeat, args.warmup)
    backend = module.last_backend[0]
    del x
    inputs = block_inputs(blocks, args.batch, args.head_dim, dtype, device)
    t_blocks = timed(dense_backend_step(backend, inputs, args.causal, backward), device, args.repeat, args.warmup)
    t_sdpa = timed(dense_sdpa_step(inputs, args.causal, backward), device, args.repeat, args.warmup)
    row.update(
        {
            "block_backend": backend,
            "module_ms": t_module * 1e3,
            "dense_blocks_ms": t_blocks * 1e3,
            "sdpa_blocks_ms": t_sdpa * 1e3,
            "module_tflops": flops / t_module / 1e12,
            "dense_blocks_tflops": flops / t_blocks / 1e12,
            "sdpa_blocks_tflops": flops / t_sdpa / 1e12,
            "ratio": t_blocks / t_module,
            "ratio_vs_sdpa_default": t_sdpa / t_module,
        }
    )
    if args.trace and row["ratio"] < args.trace_below:
        row["trace"] = write_trace(args, module, seq_len, dtype, backward)
    return row


def write_trace(args, module, seq_len, dtype, backward) -> str:
    from torch.profiler import ProfilerActivity, profile

    x = [torch.randn(args.batch, seq_len, args.heads, args.head_dim, dtype=dtype, device=args.device) for _ in range(4)]
    for t in x[:3]:
        t.requires_grad_(backward)
    step = module_step(module, x, args.causal, backward)
    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if args.device == "cuda":
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    path = Path(args.trace) / f"dense_blocks_profile_{seq_len}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=25))
    return str(path)


def parse_list(text: str) -> list[int]:
    units = {"k": 1024, "m": 1024 * 1024}
    return [int(v[:-1]) * units[v[-1].lower()] if v[-1].lower() in units else int(v) for v in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", choices=("fwd", "fwdbwd"), default="fwdbwd")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seq-len", type=parse_list, default=parse_list("64k,1m"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--segments", type=parse_list, default=[2048, 4096, 8192])
    ap.add_argument("--dilations", type=parse_list, default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trace", help="folder for profiler tables of points below --trace-below")
    ap.add_argument("--trace-below", type=float, default=0.8)
    ap.add_argument("--out", help="JSONL file, one row per N (appended)")
    args = ap.parse_args()
    for seq_len in args.seq_len:
        row = measure(args, seq_len)
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
