"""ImprovedDilatedAttention against the fastest dense kernel on the same blocks (issue 28, item 6a).

For each N, the dilated module's fwd(+bwd) is timed, then every dense attention kernel alone on exactly the
blocks the module computes (kernels/pattern.py build_blocks: one (B*segments, heads, rows, D) problem per
block, made contiguous beforehand, so no gather or merge is timed). All are charged the same FLOPs
(workload/counts.py: 4*D*pairs, x3.5 with backward), so

    ratio_vs_fastest = module TFLOP/s / the fastest kernel's TFLOP/s on the blocks

is the share of the best kernel's speed the module keeps after its gathers, merges and launches. The row also
holds the block kernel the module ran on (`block_kernel`), the host time to issue one call (`module_host_ms`:
close to `module_ms`, the call is launch-bound) and the same call on the engine's accumulating path
(`module_accumulating_ms`, DATTN_FUSED_MERGE=0) beside the one-pass combine (kernels/combine.py). Every kernel's
figure is in the row as `<kernel>_blocks_tflops` (None with `<kernel>_blocks_error` where it cannot run here):
the module's own block backend (`backend`), cudnn, fa2 (aten's FlashAttention-2 op), efficient, sdpa_default
(F.scaled_dot_product_attention's own choice) and fa4 (flash_attn.cute). "Fastest" is the best of cudnn, fa4
and fa2 (FASTEST_OF). Each kernel's first call (cuDNN's graph build, FA4's compile) is timed apart, as
`<kernel>_first_call_s`, outside the samples. With --trace DIR, a torch.profiler table of the module's call is
written per N.

    python benchmarks/dense_blocks.py --device cuda --dtype bfloat16 --seq-len 65536,1048576 --out r.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dattn_cli.kernels import ImprovedDilatedAttention, merge_fused  # noqa: E402
from dattn_cli.kernels.backends import BACKENDS, BlockCall  # noqa: E402
from dattn_cli.kernels.block_kernels import kernels_used, reset_kernels_used  # noqa: E402
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


def sdpa_step(inputs, causal: bool, backward: bool, forced: str | None = None):
    """F.scaled_dot_product_attention on every block (autograd for the backward); `forced`: the one SDPBackend
    allowed (an input it cannot take raises instead of falling back to another kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [[x.detach().requires_grad_(backward) for x in (q, k, v)] + [dout] for q, k, v, dout in inputs]

    def step():
        with sdpa_kernel(getattr(SDPBackend, forced)) if forced else contextlib.nullcontext():
            for q, k, v, dout in leaves:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if backward:
                    torch.autograd.grad(out, (q, k, v), dout)

    return step


def fa4_step(inputs, causal: bool, backward: bool):
    """FlashAttention-4 on every block, fed (b, m, h, D) views of the (b, h, m, D) blocks (last dim contiguous)."""
    from flash_attn.cute.interface import flash_attn_func

    leaves = [
        [x.detach().transpose(1, 2).requires_grad_(backward) for x in (q, k, v)] + [dout.transpose(1, 2)]
        for q, k, v, dout in inputs
    ]

    def step():
        for q, k, v, dout in leaves:
            out = flash_attn_func(q, k, v, causal=causal)
            out = out[0] if isinstance(out, tuple) else out
            if backward:
                torch.autograd.grad(out, (q, k, v), dout)

    return step


# kernel -> (devices it is measured on, step maker); the module's own backend is added per row as "backend"
KERNELS = {
    "cudnn": (("cuda",), lambda i, c, b: sdpa_step(i, c, b, "CUDNN_ATTENTION")),
    "fa2": (("cuda",), lambda i, c, b: sdpa_step(i, c, b, "FLASH_ATTENTION")),
    "efficient": (("cuda", "cpu"), lambda i, c, b: sdpa_step(i, c, b, "EFFICIENT_ATTENTION")),
    "sdpa_default": (("cuda", "cpu"), lambda i, c, b: sdpa_step(i, c, b)),
    "fa4": (("cuda",), fa4_step),
}
FASTEST_OF = ("cudnn", "fa4", "fa2")


def kernel_figures(name: str, make_step, args, inputs, flops: float, backward: bool) -> dict:
    """`<name>_blocks_tflops`, `_blocks_ms` and `_first_call_s` (cuDNN graph build, FA4 compile: not in the
    samples), or `<name>_blocks_error` where the kernel cannot run here."""
    try:
        step = make_step(inputs, args.causal, backward)
        t0 = time.perf_counter()
        step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
        seconds = timed(step, args.device, args.repeat, args.warmup)
    except Exception as exc:  # not installed, not on this device, or the kernel refuses these blocks
        return {f"{name}_blocks_tflops": None, f"{name}_blocks_error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    return {
        f"{name}_blocks_tflops": flops / seconds / 1e12,
        f"{name}_blocks_ms": seconds * 1e3,
        f"{name}_first_call_s": first,
    }


def host_ms(step, device: str, repeat: int) -> float:
    """Median seconds the host takes to issue one call (the device idle before each): near the call's own time,
    the module is launch-bound."""
    samples = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    if device == "cuda":
        torch.cuda.synchronize()
    return statistics.median(samples)


@contextlib.contextmanager
def accumulating():
    """The engine's accumulating path instead of the one-pass combine (kernels/combine.py)."""
    before = os.environ.get(merge_fused.ENV)
    os.environ[merge_fused.ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(merge_fused.ENV) if before is None else os.environ.update({merge_fused.ENV: before})


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
    kv_heads = getattr(args, "kv_heads", None) or args.heads  # GQA: k, v at fewer heads, repeated by the module
    heads = [args.heads, kv_heads, kv_heads, args.heads]
    x = [torch.randn(args.batch, seq_len, h, args.head_dim, dtype=dtype, device=device) for h in heads]
    for t in x[:3]:
        t.requires_grad_(backward)
    row = {
        "seq_len": seq_len,
        **{name: getattr(args, name) for name in ("batch", "heads", "head_dim", "segments", "dilations")},
        "kv_heads": kv_heads,
        **{name: getattr(args, name) for name in ("dtype", "mode", "causal", "device")},
        "blocks": len(blocks),
        "flops": flops,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "card": torch.cuda.get_device_name() if device == "cuda" else None,
    }
    step = module_step(module, x, args.causal, backward)
    reset_kernels_used()
    t_module = timed(step, device, args.repeat, args.warmup)
    backend = module.last_backend[0]
    row.update(block_backend=backend, block_kernel=kernels_used(), module_ms=t_module * 1e3)
    row.update(module_tflops=flops / t_module / 1e12, module_host_ms=host_ms(step, device, args.repeat) * 1e3)
    with accumulating():  # the same call merged block by block into fp32 accumulators (kernels/merge.py)
        t_acc = timed(step, device, args.repeat, args.warmup)
    row.update(module_accumulating_ms=t_acc * 1e3, module_accumulating_tflops=flops / t_acc / 1e12)
    if args.trace:
        row["trace"] = write_trace(args, module, x, seq_len, backward)
    del x
    inputs = block_inputs(blocks, args.batch, args.head_dim, dtype, device)
    make_backend = lambda i, c, b: dense_backend_step(backend, i, c, b)  # noqa: E731
    row.update(kernel_figures("backend", make_backend, args, inputs, flops, backward))
    for name, (devices, make_step) in KERNELS.items():
        if name in args.kernels:
            if device not in devices:
                row.update({f"{name}_blocks_tflops": None, f"{name}_blocks_error": f"not measured on {device}"})
            else:
                row.update(kernel_figures(name, make_step, args, inputs, flops, backward))
    return {**row, **ratios(row)}


def ratios(row: dict) -> dict:
    """The module against the fastest of FASTEST_OF that ran (else of every kernel that ran), and against each."""
    ran = {k: row[f"{k}_blocks_tflops"] for k in ["backend", *KERNELS] if row.get(f"{k}_blocks_tflops")}
    pool = {k: v for k, v in ran.items() if k in FASTEST_OF} or ran
    if not pool:
        return {"fastest_kernel": None, "ratio_vs_fastest": None}
    fastest = max(pool, key=pool.get)
    return {
        "fastest_kernel": fastest,
        "fastest_of": sorted(pool),
        "fastest_blocks_tflops": pool[fastest],
        "ratio_vs_fastest": row["module_tflops"] / pool[fastest],
        **{f"ratio_vs_{k}": row["module_tflops"] / v for k, v in ran.items()},
    }


def write_trace(args, module, x, seq_len, backward) -> str:
    """A torch.profiler table of one module call (after one untimed call), sorted by self time."""
    from torch.profiler import ProfilerActivity, profile

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
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=30))
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
    ap.add_argument("--kv-heads", type=int, help="k, v heads (GQA; the dense kernels get the blocks at all heads)")
    ap.add_argument("--segments", type=parse_list, default=[2048, 4096, 8192])
    ap.add_argument("--dilations", type=parse_list, default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trace", help="folder for a profiler table of the module's call at each N")
    ap.add_argument(
        "--kernels", type=lambda t: t.split(","), default=list(KERNELS), help=f"of {','.join(KERNELS)} (default all)"
    )
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
