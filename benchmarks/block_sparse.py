"""Block-sparse cost against density: does the time really fall with the pattern?

Issue target (CPU, fp32, B = 1, N = 32768, H = 8, D = 64, forward): the `local` pattern at ~10% density
takes <= 0.25x the time of dense SDPA, measured side by side in one run; and time against density for
5%, 10% and 25% scales near-proportionally (the fitted line and log-log exponent are printed). Also
measured: compiled CPU FlexAttention (executor=flex) at 10%, next to the gather executor that `auto`
picks on CPU.

    python benchmarks/block_sparse.py [--seq-len 32k] [--repeat 5] [--no-flex] [--out FILE.jsonl [--resume]] \
        [--plot FILE.png]
    python benchmarks/block_sparse.py --seq-len 2k --repeat 1 --no-flex     # a quick look (seconds)
    python benchmarks/block_sparse.py --out benchmarks/block_sparse_cpu.jsonl --resume   # the shipped rows again

Every point runs through `dattn bench`'s sweep (one isolated worker per point), so the rows are
ordinary bench rows (pattern and element_density columns); this script puts them side by side. Each run
measures afresh into a new results/block_sparse-<time>.jsonl (plot: the same name, .png) unless --out
names the report; --resume continues that report, measuring only the points it lacks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _reports import Report, add_resume_option, report_path, script_command

from dattn_cli.bench import Sweep
from dattn_cli.bench.plot import fit_density, plot_density
from dattn_cli.plan import predicted_peak_bytes
from dattn_cli.workload import parse_seq_lens
from dattn_cli.workload.records import read_rows

IMPL = "BlockSparseRingDilatedAttention"
DENSITIES = [0.05, 0.10, 0.25]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", default="32k")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=None, help="JSONL report (default: a new results/block_sparse-<time>.jsonl)"
    )
    add_resume_option(parser)
    parser.add_argument(
        "--plot", type=Path, default=None, help="PNG of time against density (default: the report's name, .png)"
    )
    parser.add_argument("--no-flex", action="store_true", help="skip the compiled FlexAttention point")
    args = parser.parse_args()
    out = report_path(parser, args.out, args.resume, "block_sparse")
    plot = args.plot or out.with_suffix(".png")
    n = parse_seq_lens(args.seq_len)[0]
    common = dict(
        seq_lens=[n],
        mode="fwd",
        batch=1,
        heads=8,
        head_dim=64,
        warmup=1,
        repeat=args.repeat,
        max_memory=16 * 2**30,
        max_seconds=900.0,
        pattern="local",
        block_size=128,
    )
    report = Report(parser, out, args.resume, script_command())
    show = lambda r: print(f"  {r.impl} {r.pattern or 'dense'}: {r.status} {r.time_ms} ms", flush=True)  # noqa: E731
    configs = [Sweep(impls=["sdpa", IMPL], densities=DENSITIES, **common)]
    if not args.no_flex:  # the compile happens in the warm-up call
        configs.append(Sweep(impls=[IMPL], densities=[0.10], executor="flex", **{**common, "warmup": 2}))
    for cfg in configs:
        report.sweep(cfg, on_row=show, predict=predicted_peak_bytes)

    rows = [r for r in read_rows(out) if r.seq_len == n and r.status == "ok"]
    dense = next(r for r in rows if r.impl == "sdpa")
    auto = sorted((r for r in rows if r.impl == IMPL and "[" not in r.pattern), key=lambda r: r.element_density)
    flex = [r for r in rows if r.impl == IMPL and r.pattern.endswith("[flex]")]
    print(
        f"\nN={n}, fwd, fp32: dense sdpa {dense.time_ms:.1f} ms "
        f"(p10 {dense.time_ms_p10:.1f}, p90 {dense.time_ms_p90:.1f})"
    )
    for r in auto + flex:
        print(
            f"  {r.pattern:<26} density {r.element_density:.4f}: {r.time_ms:8.1f} ms "
            f"(p10 {r.time_ms_p10:.1f}, p90 {r.time_ms_p90:.1f}) = {r.time_ms / dense.time_ms:.3f} x dense sdpa"
        )
    for fit in fit_density(auto):
        print("  fit (executor auto = gather on CPU): " + fit.line())
    plot_density(auto + [dense], plot)
    print(f"  rows: {out}, plot: {plot}")
    if flex:
        same = [r for r in auto if r.pattern == flex[0].pattern.replace(" [flex]", "")]
        if same:
            print(f"  compiled CPU FlexAttention / gather at the same pattern: {flex[0].time_ms / same[0].time_ms:.2f}")


if __name__ == "__main__":
    main()
