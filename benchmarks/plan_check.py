"""The planner against a CPU bench report: memory for every ok row, time after calibrating on half.

    python benchmarks/plan_check.py REPORT.jsonl [--profile cpu-host]

Memory: `dattn plan --check` on every ok row (target: within +-10%). Time: the rows are split by
alternating sequence length per (impl, mode); `dattn plan --calibrate` fits efficiencies on one half
and `--check` with the calibrated profile measures the error on the other half (target: +-25%).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dattn_cli.plan.check import calibrate, check_rows, summary
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload.records import read_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("--profile", default="cpu-host")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    rows = [r for r in read_rows(args.report) if r.status == "ok"]
    memory = check_rows(rows, profile)
    print(
        memory[["impl", "seq_len", "mode", "measured_mem_bytes", "predicted_mem_bytes", "mem_error_pct"]].to_string(
            index=False
        )
    )
    stats = summary(memory)
    print(
        f"memory: median |error| {stats['mem_error_pct_median_abs']:.1f}%, max {stats['mem_error_pct_max_abs']:.1f}% "
        f"over {len(memory)} ok rows\n"
    )
    groups: dict = {}
    for r in sorted(rows, key=lambda r: r.seq_len):
        groups.setdefault((r.impl, r.mode), []).append(r)
    fit = [r for g in groups.values() for r in g[0::2]]
    held = [r for g in groups.values() for r in g[1::2]]
    with tempfile.TemporaryDirectory() as tmp:
        source = str(Path(tmp) / "calibration-half.jsonl")
        calibrated = calibrate(fit, profile, source)
    print("fitted on N =", sorted({r.seq_len for r in fit}), json.dumps(calibrated.efficiency.per_impl, indent=1))
    timing = check_rows(held, calibrated)
    print(timing[["impl", "seq_len", "mode", "measured_ms", "predicted_ms", "time_error_pct"]].to_string(index=False))
    stats = summary(timing)
    print(
        f"time on the held-out half: median |error| {stats['time_error_pct_median_abs']:.1f}%, "
        f"max {stats['time_error_pct_max_abs']:.1f}% over {len(timing)} rows"
    )


if __name__ == "__main__":
    main()
