"""Fit the CPU-only terms of the layer memory model (plan/layers.py: CPU_RUNTIME_MIB).

    python benchmarks/layer_fit.py [--out FILE.jsonl [--resume]]
    python benchmarks/layer_fit.py --out benchmarks/layer_fit_cpu.jsonl --resume   # refit the shipped rows

Each run measures afresh into a new results/layer_fit_cpu-<time>.jsonl unless --out names the report;
--resume continues that report, measuring only the points it lacks.

Measures a small E=256 block and a 2-layer LongNetLM (vocabulary 8,192) with every option (plain,
checkpointing, bf16 autocast, both; forward+backward, plus forward-only rows) and fits, by least squares,

    measured peak - planned tensor bytes - framework = sum(runtime[o] for o in the row's options)

where the options are block (every row), autocast, checkpointing and model. It also fits the same with a
term `scratch * activation bytes at the peak` added, to show whether kernel scratch in proportion to the
activations is worth modelling (it is not: about 1% under bench's RSS method). The E=768 rows of
layer_claims.py are not used here: they are the out-of-sample check.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _reports import Report, add_resume_option, report_path, script_command

from dattn_cli.bench import Sweep
from dattn_cli.plan import predicted_peak_bytes
from dattn_cli.plan.layers import layer_memory
from dattn_cli.plan.memory import framework_bytes
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload.records import read_rows, row_problem

IMPL = "ImprovedMultiheadDilatedAttention"
STATE_ITEMS = ("weights", "AdamW moments", "parameter gradients", "optimizer temporary", "tokens")  # not activations
OPTIONS = [{}, {"checkpointing": True}, {"amp": "bf16"}, {"checkpointing": True, "amp": "bf16"}]
TERMS = ["block", "autocast", "checkpointing", "model"]


def configs() -> list[Sweep]:
    common = dict(
        impls=[IMPL],
        heads=4,
        head_dim=64,
        causal=True,
        segment_lengths=[2048, 4096, 8192],
        dilation_rates=[1, 2, 4],
        warmup=1,
        repeat=1,
        max_memory=16 * 2**30,
        max_seconds=600.0,
    )
    out = []
    for options in OPTIONS:
        out.append(Sweep(**common, target="layer", mode="fwdbwd", seq_lens=[2048, 4096, 8192, 16384], **options))
        out.append(
            Sweep(
                **common,
                target="model",
                mode="fwdbwd",
                layers=2,
                vocab_size=8192,
                seq_lens=[1024, 4096, 16384],
                **options,
            )
        )
    for amp in (None, "bf16"):
        out.append(Sweep(**common, target="layer", mode="fwd", seq_lens=[4096, 16384], amp=amp))
        out.append(
            Sweep(**common, target="model", mode="fwd", layers=2, vocab_size=8192, seq_lens=[4096, 16384], amp=amp)
        )
    return out


def residual_terms(row, profile) -> tuple[list[float], float, float]:
    """(design row: option indicators + activation bytes, measured - tensors - framework, measured)."""
    shape = row_problem(row)
    tensors = layer_memory(shape, 0, "cuda")  # tensor items only, at the peak phase
    activations = tensors.total - sum(tensors.items.get(k, 0) for k in STATE_ITEMS)
    used = {
        "block": True,
        "autocast": bool(row.amp),
        "checkpointing": row.checkpointing and row.mode == "fwdbwd",
        "model": row.target == "model",
    }
    x = [float(used[t]) * 2**20 for t in TERMS] + [float(activations)]
    y = row.peak_mem_bytes - tensors.total - framework_bytes(profile, row.mode)
    return x, float(y), float(row.peak_mem_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, default=None, help="JSONL report (default: a new results/layer_fit_cpu-<time>.jsonl)"
    )
    add_resume_option(parser)
    args = parser.parse_args()
    out = report_path(parser, args.out, args.resume, "layer_fit_cpu")
    report = Report(parser, out, args.resume, script_command())
    for cfg in configs():
        report.sweep(
            cfg,
            on_row=lambda r: print(
                f"  {r.target} {r.mode} ckpt={r.checkpointing} amp={r.amp} N={r.seq_len}: {r.status}", flush=True
            ),
            predict=predicted_peak_bytes,
        )
    profile = load_profile("cpu-host")
    rows = [r for r in read_rows(out) if r.status == "ok"]
    print(f"rows: {out}")
    design, target, measured = map(np.array, zip(*(residual_terms(r, profile) for r in rows)))
    for columns, label in ((slice(0, 4), "runtime terms (the model)"), (slice(0, 5), "runtime terms + scratch")):
        coef, *_ = np.linalg.lstsq(design[:, columns], target, rcond=None)
        errors = (design[:, columns] @ coef - target) / measured
        scratch = f", scratch {coef[4]:.3f} of activations" if len(coef) > 4 else ""
        print(
            f"\n{label}, {len(rows)} rows: " + ", ".join(f"{t} {c:.1f} MiB" for t, c in zip(TERMS, coef[:4])) + scratch
        )
        print(
            f"  in-sample memory error: median {np.median(np.abs(errors)) * 100:.1f}%, "
            f"max {np.max(np.abs(errors)) * 100:.1f}%"
        )


if __name__ == "__main__":
    main()
