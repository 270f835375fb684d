"""Side-by-side CPU benchmark for the foundation issue's targets (see benchmarks/RESULTS.md).

`kernel_floor` is not an implementation: it runs PyTorch's fused CPU attention kernel alone on
contiguous random blocks of exactly the shapes the dilated pattern needs (no gather, no merge, no
scatter), i.e. the time any implementation built on that kernel cannot go below.

Each (implementation, mode) runs in its own spawned process, so peak memory is that process's peak
RSS during the first call above its RSS once the inputs exist (ru_maxrss delta), and nothing one
case allocates inflates another. The first call doubles as warm-up; the median of `--repeat` further
calls is the time. Inputs are fresh torch.randn.

    python benchmarks/single_device.py                 # the targets: fwd N=32768, fwd+bwd N=16384
    python benchmarks/single_device.py --fwd-n 8192 --fwdbwd-n 4096 --repeat 1   # quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import statistics
import time

SEGMENTS, DILATIONS = [2048, 4096, 8192], [1, 2, 4]
IMPLS = ("sdpa_dense", "kernel_floor", "DilatedAttention", "ImprovedDilatedAttention")


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _case(impl: str, mode: str, n: int, heads: int, head_dim: int, repeat: int, threads: int, queue) -> None:
    import torch

    from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    grad = mode == "fwdbwd"
    q, k, v = (torch.randn(1, n, heads, head_dim, requires_grad=grad) for _ in range(3))
    if impl == "kernel_floor":
        from dattn_cli.kernels.pattern import build_blocks

        fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        bwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        shapes = [(b.num_segments, b.num_heads, b.rows, head_dim) for b in build_blocks(n, heads, SEGMENTS, DILATIONS, "longnet")]
        blocks = [[torch.randn(shape) for _ in range(4)] for shape in shapes]

        def step():
            for bq, bk, bv, bdo in blocks:
                o, lse = fwd_op(bq, bk, bv)
                if grad:
                    bwd_op(bdo, bq, bk, bv, o, lse, 0.0, False)
    elif impl == "sdpa_dense":
        def run():
            out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return out.transpose(1, 2)
    else:
        module = {"DilatedAttention": DilatedAttention, "ImprovedDilatedAttention": ImprovedDilatedAttention}[impl](
            SEGMENTS, DILATIONS
        )
        def run():
            return module(q, k, v)

    def module_step():
        if grad:
            out = run()
            out.backward(torch.ones_like(out))
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                run()

    if impl != "kernel_floor":
        step = module_step
    base = _rss_bytes()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    peak = _rss_bytes() - base
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    queue.put({"impl": impl, "mode": mode, "seq_len": n, "first_s": first, "median_s": statistics.median(times),
               "times_s": times, "peak_rss_delta_bytes": peak})


def measure(impl: str, mode: str, n: int, args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_case, args=(impl, mode, n, args.heads, args.head_dim, args.repeat, args.threads, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fwd-n", type=int, default=32768)
    parser.add_argument("--fwdbwd-n", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per case (0 = torch default)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.threads == 0:
        import torch

        args.threads = torch.get_num_threads()
    rows = []
    for mode, n in (("fwd", args.fwd_n), ("fwdbwd", args.fwdbwd_n)):
        for impl in IMPLS:
            row = measure(impl, mode, n, args)
            rows.append(row)
            print(f"{mode:7s} N={n:6d} {impl:26s} median {row['median_s']:8.3f} s  first {row['first_s']:8.3f} s  "
                  f"peak RSS +{row['peak_rss_delta_bytes'] / 2**20:8.1f} MiB", flush=True)
    from dattn_cli.kernels.pattern import attended_pairs, build_blocks

    for n in sorted({args.fwd_n, args.fwdbwd_n}):
        pairs = attended_pairs(1, build_blocks(n, args.heads, SEGMENTS, DILATIONS, "longnet"), False)
        print(f"N={n}: the pattern computes {pairs / (args.heads * n * n):.4f} of the dense (query, key) pairs")
    print(f"\nB=1 H={args.heads} D={args.head_dim} fp32, segments {SEGMENTS}, dilations {DILATIONS}, "
          f"{args.threads} threads, {platform.processor() or platform.machine()}")
    for mode in ("fwd", "fwdbwd"):
        by = {r["impl"]: r for r in rows if r["mode"] == mode}
        dense = by["sdpa_dense"]["median_s"]
        for impl in IMPLS[1:]:
            print(f"{mode:7s} {impl:26s} time / dense SDPA = {by[impl]['median_s'] / dense:.3f}")
        print(f"{mode:7s} ImprovedDilatedAttention time / kernel floor = "
              f"{by['ImprovedDilatedAttention']['median_s'] / by['kernel_floor']['median_s']:.3f}")
        imp, dil = by["ImprovedDilatedAttention"], by["DilatedAttention"]
        print(f"{mode:7s} Improved / Dilated: time {imp['median_s'] / dil['median_s']:.3f}, "
              f"peak memory {imp['peak_rss_delta_bytes'] / max(1, dil['peak_rss_delta_bytes']):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
