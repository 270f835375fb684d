"""Side-by-side CPU benchmark for the foundation issue's targets (see benchmarks/RESULTS.md).

Time: one spawned process per mode builds every implementation on the same fresh torch.randn inputs,
warms each up once, then runs `--repeat` rounds; each round calls every implementation once, in a
rotating order, so slow drifts of a shared machine hit all of them alike. Reported: the median per
implementation and the median of the per-round ratios.

Memory: each (implementation, mode) runs once more in its own spawned process; peak memory is that
process's peak RSS during the call above its RSS once the inputs exist (ru_maxrss delta), so nothing
one case allocates inflates another.

`kernel_floor` is not an implementation: PyTorch's fused CPU attention kernel alone on contiguous
random blocks of exactly the shapes the dilated pattern needs (no gather, merge or scatter), i.e. the
time an implementation built on that kernel cannot go below.

    python benchmarks/single_device.py                 # the targets: fwd N=32768, fwd+bwd N=16384
    python benchmarks/single_device.py --fwd-n 8192 --fwdbwd-n 4096 --repeat 2   # quick look
    python benchmarks/single_device.py --fwd-n 1024 --fwdbwd-n 1024 --repeat 1 --no-memory   # seconds: time only

Every run measures afresh (nothing is read from an earlier run); --json FILE also writes the rows.
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


def _steps(impls, mode: str, n: int, heads: int, head_dim: int):
    """One zero-argument callable per implementation, all on the same inputs."""
    import torch

    from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention
    from dattn_cli.kernels.pattern import build_blocks

    grad = mode == "fwdbwd"
    q, k, v = (torch.randn(1, n, heads, head_dim, requires_grad=grad) for _ in range(3))
    upstream = torch.randn(1, n, heads, head_dim)
    steps = {}
    for impl in impls:
        if impl == "kernel_floor":
            fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
            bwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
            shapes = [
                (b.num_segments, b.num_heads, b.rows, head_dim)
                for b in build_blocks(n, heads, SEGMENTS, DILATIONS, "longnet")
            ]
            blocks = [[torch.randn(shape) for _ in range(4)] for shape in shapes]

            def step(blocks=blocks):
                for bq, bk, bv, bdo in blocks:
                    o, lse = fwd_op(bq, bk, bv)
                    if grad:
                        bwd_op(bdo, bq, bk, bv, o, lse, 0.0, False)
        else:
            if impl == "sdpa_dense":

                def run(q, k, v):
                    t = lambda x: x.transpose(1, 2)  # noqa: E731
                    return t(torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v)))
            else:
                run = {"DilatedAttention": DilatedAttention, "ImprovedDilatedAttention": ImprovedDilatedAttention}[
                    impl
                ](SEGMENTS, DILATIONS)

            def step(run=run):
                if grad:
                    run(q, k, v).backward(upstream)
                    q.grad = k.grad = v.grad = None
                else:
                    with torch.no_grad():
                        run(q, k, v)

        steps[impl] = step
    return steps


def _time_worker(impls, mode, n, heads, head_dim, repeat, queue) -> None:
    steps = _steps(impls, mode, n, heads, head_dim)
    for step in steps.values():
        step()  # warm-up
    times = {impl: [] for impl in impls}
    for r in range(repeat):
        order = list(impls[r % len(impls) :]) + list(impls[: r % len(impls)])
        for impl in order:
            t0 = time.perf_counter()
            steps[impl]()
            times[impl].append(time.perf_counter() - t0)
    queue.put(times)


def _memory_worker(impl, mode, n, heads, head_dim, queue) -> None:
    step = _steps([impl], mode, n, heads, head_dim)[impl]
    base = _rss_bytes()
    step()
    queue.put(_rss_bytes() - base)


def _spawn(target, *args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    while True:  # a worker that dies (crash, OOM kill) must not leave us waiting forever
        try:
            result = queue.get(timeout=5)
            break
        except Exception:
            if not proc.is_alive():
                raise SystemExit(
                    f"benchmark worker {target.__name__}{args[:3]} died with exit code {proc.exitcode}"
                ) from None
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fwd-n", type=int, default=32768)
    parser.add_argument("--fwdbwd-n", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="time only: skip the isolated memory processes")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    import torch

    from dattn_cli.kernels.pattern import attended_pairs, build_blocks

    print(
        f"B=1 H={args.heads} D={args.head_dim} fp32, segments {SEGMENTS}, dilations {DILATIONS}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.machine()}, "
        f"median of {args.repeat} rounds"
    )
    rows = []
    for mode, n in (("fwd", args.fwd_n), ("fwdbwd", args.fwdbwd_n)):
        pairs = attended_pairs(1, build_blocks(n, args.heads, SEGMENTS, DILATIONS, "longnet"), False)
        print(
            f"\n{mode} N={n}: the pattern computes {pairs / (args.heads * n * n):.4f} of the dense (query, key) pairs"
        )
        times = _spawn(_time_worker, IMPLS, mode, n, args.heads, args.head_dim, args.repeat)
        dense = times["sdpa_dense"]
        for impl in IMPLS:
            peak = None if args.no_memory else _spawn(_memory_worker, impl, mode, n, args.heads, args.head_dim)
            ratio = statistics.median(t / d for t, d in zip(times[impl], dense))
            row = {
                "impl": impl,
                "mode": mode,
                "seq_len": n,
                "median_s": statistics.median(times[impl]),
                "times_s": times[impl],
                "ratio_to_dense_sdpa": ratio,
                "peak_rss_delta_bytes": peak,
            }
            rows.append(row)
            memory = "" if peak is None else f"   peak RSS +{peak / 2**20:7.1f} MiB"
            print(f"  {impl:26s} median {row['median_s']:7.3f} s   / dense SDPA {ratio:6.3f}{memory}", flush=True)
        by = {r["impl"]: r for r in rows if r["mode"] == mode}
        imp, dil = by["ImprovedDilatedAttention"], by["DilatedAttention"]
        per_round = statistics.median(a / b for a, b in zip(imp["times_s"], dil["times_s"]))
        memory = (
            ""
            if args.no_memory
            else f"peak memory {imp['peak_rss_delta_bytes'] / max(1, dil['peak_rss_delta_bytes']):.3f}; "
        )
        print(
            f"  Improved / Dilated: time {per_round:.3f} (median of per-round ratios), {memory}"
            f"Improved / kernel floor: {imp['median_s'] / by['kernel_floor']['median_s']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
