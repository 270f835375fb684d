"""Fit the planner's attention efficiency curves to published TFLOP/s and report the residuals (issue 19).

    python benchmarks/plan_fit.py [--cells benchmarks/published/attention_tflops.csv] [--write] [--yaml] [--markdown]
    python benchmarks/plan_fit.py --cells OTHER.csv --shipped   # no fit: the shipped curves on other cells

Per (gpu, kernel, direction, causal, head dim, dtype) group: e_inf and n_half of
eff = e_inf x N / (N + n_half) x wave(N, batch x heads) (dattn_cli/plan/efficiency.py), by least squares on
the relative error of the predicted TFLOP/s (scipy.optimize.least_squares). A group with fewer than 3
distinct N fits e_inf only, n_half taken from the median of its (gpu, kernel, direction, causal) siblings.

Every cell is then predicted by the planner itself (dattn_cli.plan.time.estimate_time on the profile with
the fitted curves; bwd cells by the curve, the planner has no bwd-only mode), converted to the published
convention (FLOPs = 4·B·H·N²·d, halved when causal, x2.5 bwd, x3.5 fwd+bwd). Targets: within 25% for >= 80% of
cells and median |error| <= 12%, overall and per (gpu, kernel). Held out: (a) every other N of each group
fitted on the rest, (b) each head dim predicted from the curves of the other head dims (interpolation in
log2 d, or the nearest outside the fitted range).

--write puts the fitted curves into profiles/<gpu>.yaml (the efficiency.attention_curves block);
--yaml prints that block instead.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dattn_cli.plan.efficiency import KERNELS, curve_efficiency, saturation, wave_factor
from dattn_cli.plan.profiles import AttentionCurve, HardwareProfile, load_profile, shipped_profiles
from dattn_cli.plan.time import estimate_time
from dattn_cli.workload.problem import ELEMENT_BYTES, Problem

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CELLS = ROOT / "benchmarks" / "published" / "attention_tflops.csv"
COLUMNS = ("gpu", "kernel", "dtype", "direction", "causal", "head_dim", "seq_len", "batch", "heads", "tflops", "source")
HALF = ("float16", "bfloat16")
FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
GROUP = ["gpu", "kernel", "direction", "causal", "head_dim", "dtypes"]
IMPL = {"flash": ("flash", "auto"), "sdpa": ("sdpa", "auto"), "math": ("math", "auto")}


def load_cells(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise SystemExit(f"{path}: missing columns {', '.join(missing)}")
    frame = frame[pd.to_numeric(frame["tflops"], errors="coerce").notna()].copy()  # OOM / missing bars
    frame["tflops"] = frame["tflops"].astype(float)
    frame["causal"] = frame["causal"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))
    frame["dtypes"] = frame["dtype"].map(lambda d: "float16,bfloat16" if d in HALF else d)
    frame["batch"] = frame["batch"].fillna(16384 // frame["seq_len"])  # the standard shape: 16k tokens, hidden 2048
    frame["heads"] = frame["heads"].fillna(2048 // frame["head_dim"])
    for col in ("head_dim", "seq_len", "batch", "heads"):
        frame[col] = frame[col].astype(int)
    known = set(shipped_profiles())
    unknown = sorted(set(frame["gpu"]) - known)
    if unknown:
        print(f"skipping cells of {', '.join(unknown)}: no such shipped profile ({', '.join(sorted(known))})")
    return frame[frame["gpu"].isin(known)].reset_index(drop=True)


def published_flops(cell) -> float:
    return (
        4.0
        * cell.batch
        * cell.heads
        * cell.seq_len**2
        * cell.head_dim
        * (0.5 if cell.causal else 1.0)
        * FACTOR[cell.direction]
    )


def _model(params, cells: pd.DataFrame, peak: float, units: int | None) -> np.ndarray:
    e_inf, n_half = params
    return (
        np.array(
            [
                saturation(c.seq_len, e_inf, n_half) * wave_factor(c.seq_len, c.batch * c.heads, units)
                for c in cells.itertuples()
            ]
        )
        * peak
        / 1e12
    )


def fit_group(cells: pd.DataFrame, peak: float, units: int | None, n_half: float | None = None) -> tuple[float, float]:
    """(e_inf, n_half) minimising the relative error of the predicted TFLOP/s; n_half fixed when given."""
    published = cells["tflops"].to_numpy(float)
    start_e = min(0.99, float(published.max()) * 1e12 / peak * 1.1)
    if n_half is not None:
        fun = lambda x: _model((x[0], n_half), cells, peak, units) / published - 1  # noqa: E731
        found = least_squares(fun, [start_e], bounds=([1e-4], [1.0]))
        return float(found.x[0]), float(n_half)
    fun = lambda x: _model(x, cells, peak, units) / published - 1  # noqa: E731
    found = least_squares(fun, [start_e, 500.0], bounds=([1e-4, 0.0], [1.0, 1e6]))
    return float(found.x[0]), float(found.x[1])


def fit_all(cells: pd.DataFrame) -> list[dict]:
    """One fitted curve per group; groups with < 3 distinct N take their siblings' median n_half."""
    profiles = {g: load_profile(g) for g in cells["gpu"].unique()}
    fitted, pending = [], []
    for key, group in cells.groupby(GROUP, sort=True):
        entry = dict(zip(GROUP, key), cells=group)
        (pending if group["seq_len"].nunique() < 3 else fitted).append(entry)
    for entry in fitted + pending:
        hw = profiles[entry["gpu"]]
        peak = hw.peak_flops(entry["dtypes"].split(",")[0])
        siblings = [f["n_half"] for f in fitted if "n_half" in f and all(f[k] == entry[k] for k in GROUP[:4])]
        fixed = None if entry in fitted else (statistics.median(siblings) if siblings else 500.0)
        entry["e_inf"], entry["n_half"] = fit_group(entry["cells"], peak, hw.efficiency.compute_units, fixed)
        entry["source"] = "; ".join(sorted(set(entry["cells"]["source"])))
    return fitted + pending


def curves_of(entries: list[dict], gpu: str) -> list[AttentionCurve]:
    return [
        AttentionCurve(
            kernel=e["kernel"],
            direction=e["direction"],
            causal=bool(e["causal"]),
            head_dim=int(e["head_dim"]),
            dtypes=e["dtypes"].split(","),
            e_inf=round(e["e_inf"], 4),
            n_half=round(e["n_half"], 1),
            source=e["source"],
        )
        for e in entries
        if e["gpu"] == gpu
    ]


def with_curves(profile: HardwareProfile, curves: list[AttentionCurve]) -> HardwareProfile:
    eff = profile.efficiency.model_copy(update={"attention_curves": curves, "kernel_scale": {}})
    return profile.model_copy(update={"efficiency": eff})


def predict(cell, hw: HardwareProfile) -> float:
    """Predicted TFLOP/s of one published cell in the published FLOP convention, by the planner (bwd cells, float8
    and kernels the planner does not pick, e.g. cudnn: by the curve alone)."""
    if cell.direction == "bwd" or cell.kernel not in KERNELS or cell.dtype not in ELEMENT_BYTES:
        eff = curve_efficiency(
            hw.efficiency,
            cell.kernel,
            cell.dtype,
            cell.head_dim,
            cell.causal,
            cell.direction,
            cell.seq_len,
            cell.batch * cell.heads,
            hw.ridge(cell.dtype),
        )
        return float("nan") if eff is None else eff * hw.peak_flops(cell.dtype) / 1e12
    impl, backend = IMPL.get(cell.kernel, ("flash", cell.kernel))
    problem = Problem(
        impl=impl,
        backend=backend,
        batch=cell.batch,
        seq_len=cell.seq_len,
        heads=cell.heads,
        head_dim=cell.head_dim,
        dtype=cell.dtype,
        causal=cell.causal,
        mode=cell.direction,
        device="cuda",
        segment_lengths=[cell.seq_len],
        dilation_rates=[1],
    )
    return published_flops(cell) / estimate_time(problem, hw).total_s / 1e12


def evaluate(cells: pd.DataFrame, entries: list[dict] | None) -> pd.DataFrame:
    """cells with predicted TFLOP/s and error (%) under the curves of `entries` (None: the shipped profiles' own)."""
    profiles = {
        g: load_profile(g) if entries is None else with_curves(load_profile(g), curves_of(entries, g))
        for g in cells["gpu"].unique()
    }
    out = cells.copy()
    out["predicted"] = [predict(c, profiles[c.gpu]) for c in cells.itertuples()]
    out["error_pct"] = 100 * (out["predicted"] - out["tflops"]) / out["tflops"]
    return out


def held_out_alternate(cells: pd.DataFrame) -> pd.DataFrame:
    """Each group fitted on its 1st, 3rd, ... N and checked on the others."""
    order = cells.groupby(GROUP)["seq_len"].rank(method="dense").astype(int)
    train, test = cells[order % 2 == 1], cells[order % 2 == 0]
    return evaluate(test, fit_all(train))


def held_out_head_dim(cells: pd.DataFrame) -> pd.DataFrame:
    """Each head dim predicted from the other head dims' curves of its (gpu, kernel, direction, causal, dtype)."""
    parts = []
    for d in sorted(cells["head_dim"].unique()):
        test = cells[cells["head_dim"] == d]
        family = set(map(tuple, cells[cells["head_dim"] != d][GROUP[:4] + ["dtypes"]].to_numpy()))
        test = test[[tuple(r) in family for r in test[GROUP[:4] + ["dtypes"]].to_numpy()]]
        if len(test):
            parts.append(evaluate(test, fit_all(cells[cells["head_dim"] != d])))
    return pd.concat(parts) if parts else cells.iloc[:0].assign(predicted=[], error_pct=[])


def scores(frame: pd.DataFrame) -> dict[str, float]:
    errors = frame["error_pct"].abs().dropna()
    return {
        "cells": len(errors),
        "within_25_pct": 100 * float((errors <= 25).mean()) if len(errors) else float("nan"),
        "median_abs_pct": float(errors.median()) if len(errors) else float("nan"),
        "max_abs_pct": float(errors.max()) if len(errors) else float("nan"),
    }


def score_table(frame: pd.DataFrame) -> pd.DataFrame:
    rows = [{"gpu": g, "kernel": k, **scores(part)} for (g, k), part in frame.groupby(["gpu", "kernel"])]
    rows.append({"gpu": "all", "kernel": "all", **scores(frame)})
    table = pd.DataFrame(rows)
    table["targets met"] = (table["within_25_pct"] >= 80) & (table["median_abs_pct"] <= 12)
    return table


def curves_yaml(curves: list[AttentionCurve]) -> str:
    lines = [
        "  attention_curves:       # fitted by benchmarks/plan_fit.py: e_inf x N / (N + n_half) x wave (docs/plan.md)"
    ]
    for c in curves:
        dtypes = "[" + ", ".join(c.dtypes) + "]"
        source = c.source.replace('"', "'")
        lines.append(
            f"    - {{kernel: {c.kernel}, direction: {c.direction}, causal: {str(c.causal).lower()}, "
            f"head_dim: {c.head_dim}, dtypes: {dtypes}, e_inf: {c.e_inf}, n_half: {c.n_half},\n"
            f'       source: "{source}"}}'
        )
    return "\n".join(lines) + "\n"


def write_curves(path: Path, curves: list[AttentionCurve]) -> None:
    """Replace (or add after efficiency.communication) the attention_curves block of a profile's YAML."""
    text = path.read_text()
    block = curves_yaml(curves)
    pattern = re.compile(r"^  attention_curves:.*\n(?:^    .*\n|^     .*\n)*", re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = re.sub(r"(^  communication:.*\n)", lambda m: m.group(1) + block, text, count=1, flags=re.M)
    path.write_text(text)
    load_profile(path)  # the result must still validate


def markdown(entries: list[dict], fitted: pd.DataFrame) -> str:
    """docs/plan.md's table: one line per fitted curve with its in-sample residuals."""
    lines = [
        "| gpu | kernel | direction | causal | d | e_inf | n_half | cells | median \\|err\\| | max \\|err\\| |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        part = fitted.loc[e["cells"].index, "error_pct"].abs()
        lines.append(
            f"| {e['gpu']} | {e['kernel']} | {e['direction']} | {'yes' if e['causal'] else 'no'} | "
            f"{e['head_dim']} | {e['e_inf']:.3f} | {e['n_half']:.0f} | {len(part)} | {part.median():.1f}% | "
            f"{part.max():.1f}% |"
        )
    return "\n".join(lines)


def report(title: str, frame: pd.DataFrame) -> None:
    print(f"\n## {title}\n")
    print(score_table(frame).to_string(index=False, float_format=lambda v: f"{v:.1f}"))


SHOWN = [
    "gpu",
    "kernel",
    "direction",
    "causal",
    "head_dim",
    "seq_len",
    "batch",
    "heads",
    "tflops",
    "predicted",
    "error_pct",
]


def fit_and_report(cells: pd.DataFrame, args: argparse.Namespace) -> None:
    entries = fit_all(cells)
    print("## fitted curves (eff = e_inf x N / (N + n_half) x wave)\n")
    params = pd.DataFrame(
        [{k: e[k] for k in GROUP + ["e_inf", "n_half"]} | {"cells": len(e["cells"])} for e in entries]
    )
    print(params.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    fitted = evaluate(cells, entries)
    print("\n## per cell (in-sample)\n")
    print(fitted[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if args.markdown:
        print("\n" + markdown(entries, fitted))
    report("in-sample", fitted)
    report("held out: every other N", held_out_alternate(cells))
    report("held out: each head dim from the others", held_out_head_dim(cells))
    for gpu in sorted(cells["gpu"].unique()):
        curves = curves_of(entries, gpu)
        if args.yaml:
            print(f"\n# {gpu}\n" + curves_yaml(curves), end="")
        if args.write:
            path = ROOT / "profiles" / f"{gpu}.yaml"
            write_curves(path, curves)
            print(f"wrote {len(curves)} curves to {path.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=Path, default=DEFAULT_CELLS, help="published cells (CSV)")
    parser.add_argument("--write", action="store_true", help="write the fitted curves into the shipped profiles")
    parser.add_argument("--yaml", action="store_true", help="print the attention_curves blocks")
    parser.add_argument("--markdown", action="store_true", help="print docs/plan.md's table of curves and residuals")
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="no fit: predict the cells with the shipped profiles as they are (cells from other sources)",
    )
    args = parser.parse_args(argv)
    cells = load_cells(args.cells)
    if args.shipped:
        checked = evaluate(cells, None)
        print("## per cell (the shipped profiles' curves, no fit)\n")
        print(checked[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        report("shipped profiles", checked)
        return
    fit_and_report(cells, args)


if __name__ == "__main__":
    main()
