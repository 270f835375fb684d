"""Work balance of zigzag shards against contiguous ones (issue 30, item 1): max/mean over ranks.

1. Attention pairs, counted exactly from the pattern (no run; kernels/distributed/work.py, as `dattn plan`):
   each rank's (query, key) pairs are those of the queries it holds (queries stay on their rank in the ring,
   all-gather and block-sparse ring). p = 4 and 8, causal, longnet semantics, H = 8, N = 8192: dense causal
   (one segment of N, dilation 1) and LongNet's default causal pattern (dattn's default segments
   [2048, 4096, 8192] / dilations [1, 2, 4], i.e. [N/4, N/2, N] / [1, 2, 4], its largest segment = N).
2. Process CPU time per rank (time.process_time: every thread of the rank's process), RingDilatedAttention,
   fwd+bwd, causal, 4 gloo ranks of 1 thread each, B=1, N=8192, H=8, D=64, fp32, the same two patterns;
   the sum over --repeat calls after one warm-up call.

3. For context, the ring's bytes sent per rank (comm_volume, the formula the tests check): under zigzag a
   causal ring goes all the way round, and chunks of N/(2p) make more segments span ranks.

Targets (not timed tests): pairs <= 1.05 under zigzag for both patterns at p = 4 and 8; CPU time <= 1.15
under zigzag, with contiguous shards >= 1.5 on the same measure.

    python benchmarks/zigzag_balance.py [--seq-len 8192] [--repeat 3] [--skip-cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from dattn_cli.kernels.distributed.layout import rank_positions
from dattn_cli.kernels.distributed.shards import comm_volume
from dattn_cli.kernels.distributed.work import pairs_per_position, rank_work

LAYOUTS = ("contiguous", "zigzag")
HEADS, DIM = 8, 64


def patterns(n: int) -> dict[str, tuple[list[int], list[int]]]:
    return {"dense causal": ([n], [1]), "LongNet default": ([n // 4, n // 2, n], [1, 2, 4])}


def pair_balance(n: int, world: int, segments: list[int], rates: list[int]) -> dict[str, float]:
    per_position = pairs_per_position(n, segments, rates, HEADS, causal=True)
    result = {}
    for layout in LAYOUTS:
        positions = torch.stack([rank_positions(r, world, n // world, layout) for r in range(world)])
        work = rank_work(per_position, positions)
        result[layout] = (work.max() / work.double().mean()).item()
    return result


def cpu_worker(rank: int, world: int, n: int, segments: list[int], rates: list[int], layout: str, repeat: int):
    """This rank's process CPU seconds over `repeat` fwd+bwd calls of its shard (after one warm-up call)."""
    import torch.distributed as dist

    from dattn_cli.kernels import RingDilatedAttention

    torch.set_num_threads(1)
    module = RingDilatedAttention(segments, rates, layout=layout)
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, n // world, HEADS, DIM, generator=g, requires_grad=True) for _ in range(3))

    def step():
        module(q, k, v, is_causal=True).sum().backward()

    step()
    dist.barrier()
    start = time.process_time()
    for _ in range(repeat):
        step()
    spent = time.process_time() - start
    dist.barrier()
    return spent


def cpu_balance(n: int, segments: list[int], rates: list[int], repeat: int, world: int = 4) -> dict[str, list[float]]:
    from dattn_cli.runtime.launch import run_distributed

    args = (n, segments, rates)
    return {layout: run_distributed(cpu_worker, world, *args, layout, repeat, timeout_s=1800) for layout in LAYOUTS}


def ratio(values: list[float]) -> float:
    return max(values) / (sum(values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3, help="timed fwd+bwd calls per rank (CPU time)")
    parser.add_argument("--skip-cpu", action="store_true", help="only the exact pair counts")
    args = parser.parse_args()
    n = args.seq_len
    print(f"attention pairs per rank, max/mean (exact; causal, longnet, H={HEADS}, N={n})")
    for name, (segments, rates) in patterns(n).items():
        for world in (4, 8):
            b = pair_balance(n, world, segments, rates)
            print(
                f"  {name:16s} segments {segments} dilations {rates} p={world}: "
                f"contiguous {b['contiguous']:.3f}  zigzag {b['zigzag']:.3f}"
            )
    print(f"ring bytes sent per rank, fwd+bwd, MiB (comm_volume; causal, B=1 H={HEADS} D={DIM} fp32, N={n}, p=4)")
    for name, (segments, rates) in patterns(n).items():
        for layout in LAYOUTS:
            counts = comm_volume("ring", n, 4, 1, HEADS, DIM, 4, segments, rates, is_causal=True, layout=layout)
            sent = ", ".join(f"{(c['forward_bytes_sent'] + c['backward_bytes_sent']) / 2**20:.0f}" for c in counts)
            print(f"  {name:16s} {layout:10s} {sent}")
    if args.skip_cpu:
        return
    print(
        f"process CPU time per rank, max/mean (RingDilatedAttention fwd+bwd causal, 4 gloo ranks x 1 thread, "
        f"B=1 N={n} H={HEADS} D={DIM} fp32, {args.repeat} calls)"
    )
    for name, (segments, rates) in patterns(n).items():
        times = cpu_balance(n, segments, rates, args.repeat)
        for layout in LAYOUTS:
            seconds = ", ".join(f"{t:.2f}" for t in times[layout])
            print(
                f"  {name:16s} {layout:10s} max/mean {ratio(times[layout]):.3f}  sum {sum(times[layout]):.2f} s  "
                f"(per rank s: {seconds})"
            )


if __name__ == "__main__":
    main()
