"""Token sliding window (issue 20 item 3): what the exact window costs, against the route there was before.

Side by side in one run (CPU, fp32, B = 1, H = 8, D = 64):
1. N = 4096, forward, a window of 64 tokens each side: `local` with block_size = 1 and window = 64 blocks (the
   only exact token window before: one backend call per query row) against `sliding_window` (the banded
   executor); the ratio is the figure. For context, `local` at block 128 (whole blocks: not the same function).
2. Cost O(N x window), fwd+bwd: sliding_window(128, 128) at N = 4k .. 32k (the fitted exponent of time in N
   should be near 1), and at N = 16k with windows of 32, 128 and 512 tokens each side (time near linear in
   c + 2·window, c = the query chunk).

    python benchmarks/sliding_window.py [--out FILE.jsonl [--resume]] [--repeat 3]
    python benchmarks/sliding_window.py --quick      # smaller sizes, seconds

Every point is an ordinary `dattn bench` row (isolated worker, samples, environment record).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from _reports import Report, add_resume_option, report_path, script_command

from dattn_cli.bench import Sweep
from dattn_cli.workload.records import read_rows

IMPL = "BlockSparseRingDilatedAttention"


def _sweeps(quick: bool, repeat: int) -> list[Sweep]:
    common = dict(
        impls=[IMPL], batch=1, heads=8, head_dim=64, warmup=1, repeat=repeat, max_memory=16 * 2**30, max_seconds=900.0
    )
    n0 = 1024 if quick else 4096
    head_to_head = [
        Sweep(seq_lens=[n0], mode="fwd", pattern="local", block_size=1, window=64, **common),
        Sweep(seq_lens=[n0], mode="fwd", pattern="sliding_window", window_left=64, window_right=64, **common),
        # not the same function: whole 128-token blocks, 128 .. 255 tokens each side (context only)
        Sweep(seq_lens=[n0], mode="fwd", pattern="local", block_size=128, window=1, **common),
    ]
    lengths = [2048, 4096, 8192] if quick else [4096, 8192, 16384, 32768]
    in_n = [
        Sweep(seq_lens=lengths, mode="fwdbwd", pattern="sliding_window", window_left=128, window_right=128, **common)
    ]
    n1 = 4096 if quick else 16384
    in_window = [
        Sweep(seq_lens=[n1], mode="fwdbwd", pattern="sliding_window", window_left=w, window_right=w, **common)
        for w in (32, 512)
    ]  # and 128, measured at n1 above
    return head_to_head + in_n + in_window


def _exponent(rows) -> float:
    xs = [math.log(r.seq_len) for r in rows]
    ys = [math.log(r.time_ms) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSONL report (default: a new results/sliding_window-<time>.jsonl)"
    )
    add_resume_option(parser)
    args = parser.parse_args()
    out = report_path(parser, args.out, args.resume, "sliding_window")
    report = Report(parser, out, args.resume, script_command())
    for cfg in _sweeps(args.quick, args.repeat):
        report.sweep(
            cfg, on_row=lambda r: print(f"  {r.pattern} N={r.seq_len} {r.mode}: {r.status} {r.time_ms} ms", flush=True)
        )
    rows = [r for r in read_rows(out) if r.status == "ok"]
    old = next(r for r in rows if r.pattern.startswith("local") and r.pattern.endswith("b=1)"))
    blocks = next(r for r in rows if r.pattern.startswith("local") and r.pattern.endswith("b=128)"))
    new = next(r for r in rows if r.mode == "fwd" and r.pattern.startswith("sliding_window"))
    print(
        f"\nN={old.seq_len} fwd, 64 tokens each side: local(block 1) {old.time_ms:.1f} ms, sliding_window "
        f"{new.time_ms:.1f} ms: {old.time_ms / new.time_ms:.0f}x faster (same pairs: {old.element_density:.5f} vs "
        f"{new.element_density:.5f} of N^2); the inexact block route local(w=1, b=128) {blocks.time_ms:.1f} ms for "
        f"{blocks.element_density:.5f} of N^2"
    )
    in_n = sorted((r for r in rows if r.mode == "fwdbwd" and "l=128," in r.pattern), key=lambda r: r.seq_len)
    print(
        "fwd+bwd, 128 each side: "
        + ", ".join(f"N={r.seq_len} {r.time_ms:.0f} ms ({1e6 * r.time_ms / r.seq_len:.1f} ns/token)" for r in in_n)
        + f"; time ~ N^{_exponent(in_n):.2f}"
    )
    n1 = max(r.seq_len for r in rows if r.mode == "fwdbwd" and "l=512," in r.pattern)
    by_window = sorted((r for r in rows if r.mode == "fwdbwd" and r.seq_len == n1), key=lambda r: r.element_density)
    print(f"fwd+bwd at N={n1}: " + ", ".join(f"{r.pattern} {r.time_ms:.0f} ms" for r in by_window))
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
