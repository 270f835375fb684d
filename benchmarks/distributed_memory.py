"""Peak memory per rank of the sequence-parallel implementations: p ranks against one process, same N.

Issue target: at p = 4 the per-rank peak (above each process's RSS after start-up / process-group
init) is at most 0.35x the p = 1 peak, on CPU, fp32, N = 64K, H = 8, D = 64, segments
[2048, 8192, 32768], dilations [1, 2, 8] (the 32768-segments span two 16K shards).

    python benchmarks/distributed_memory.py [--seq-len 64k] [--world-size 4] [--mode fwdbwd] \
        [--out FILE.jsonl [--resume]]
    python benchmarks/distributed_memory.py --seq-len 4k --world-size 2 --repeat 1     # a quick look
    python benchmarks/distributed_memory.py --out benchmarks/distributed_memory.jsonl --resume   # the shipped rows

Every point runs through `dattn bench`'s sweep (isolated workers, gloo ranks spawned per point), so the
rows are ordinary bench rows; the script only puts p = 1 and p = N side by side and prints the ratios.
Each run measures afresh into a new results/distributed_memory-<time>.jsonl unless --out names the
report; --resume continues that report, measuring only the points it lacks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _reports import Report, add_deprecated_alias, add_resume_option, report_path, script_command

from dattn_cli.bench import Sweep
from dattn_cli.plan import predicted_peak_bytes
from dattn_cli.workload import parse_seq_lens
from dattn_cli.workload.records import read_rows

IMPLS = ["RingDilatedAttention", "DistributedImprovedDilatedAttention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", default="64k")
    parser.add_argument("--world-size", type=int, default=4, help="ranks of the sharded run, next to p = 1")
    add_deprecated_alias(parser, "--nproc", "--world-size", type=int)
    parser.add_argument("--mode", default="fwdbwd", choices=["fwd", "fwdbwd"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=None, help="JSONL report (default: a new results/distributed_memory-<time>.jsonl)"
    )
    add_resume_option(parser)
    args = parser.parse_args()
    out = report_path(parser, args.out, args.resume, "distributed_memory")
    report = Report(parser, out, args.resume, script_command())
    n = parse_seq_lens(args.seq_len)[0]
    common = dict(
        impls=IMPLS,
        seq_lens=[n],
        mode=args.mode,
        heads=8,
        head_dim=64,
        segment_lengths=[2048, 8192, 32768],
        dilation_rates=[1, 2, 8],
        warmup=1,
        repeat=args.repeat,
        max_memory=16 * 2**30,
        max_seconds=900.0,
    )
    p = args.world_size
    for world_size in (1, p):
        report.sweep(
            Sweep(**common, world_size=world_size),
            on_row=lambda r: print(
                f"  p={r.world_size} {r.impl} {r.mode}: {r.status} peak {r.peak_mem_bytes} B, {r.time_ms} ms",
                flush=True,
            ),
            predict=predicted_peak_bytes,
        )
    rows = [r for r in read_rows(out) if r.seq_len == n and r.mode == args.mode and r.status == "ok"]
    print(f"\nN={n}, {args.mode}: peak memory per rank, p={p} vs p=1 (target <= 0.35x); rows: {out}")
    for impl in IMPLS:
        one = [r for r in rows if r.impl == impl and r.world_size == 1]
        many = [r for r in rows if r.impl == impl and r.world_size == p]
        if one and many:
            a, b = one[-1], many[-1]
            print(
                f"  {impl:38s} p=1 {a.peak_mem_bytes / 2**20:8.1f} MiB   p={p} max rank "
                f"{b.peak_mem_bytes / 2**20:8.1f} MiB "
                f"(ranks {[round(x / 2**20) for x in b.peak_mem_bytes_per_rank]})"
                f"   ratio {b.peak_mem_bytes / a.peak_mem_bytes:.3f}   "
                f"sent/rank/call {b.comm_bytes_sent / 2**20:.1f} MiB"
            )


if __name__ == "__main__":
    main()
