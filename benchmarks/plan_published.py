"""The planner against published multi-GPU long-context training runs (issue 29 part C).

    python benchmarks/plan_published.py [--jsonl benchmarks/plan_published.jsonl] [--markdown]

Every row of the frozen table tests/benchmarks/data/published_runs.csv that benchmarks/published_runs_plan.yaml
maps to `dattn plan` options is planned (`python -m dattn_cli plan ... --json -`, one process a row) and its
published metrics compared with the prediction:

- peak memory (within 10%): `reserved` rows against PyTorch's reserved peak, the tensor bytes the plan counts with
  the allocator margin, less the CUDA context and NCCL's buffers (neither goes through the caching allocator);
  `nvidia-smi` rows against the device total: the context, NCCL's buffers and the reserved peak;
- tokens/s/GPU (within 20%): the plan's own (`--global-batch-tokens` with the row's global batch where it gives one:
  plan/throughput.py). Rows that print only
  model TFLOP/s/GPU (NeMo, Megatron-Bridge) are compared in their own convention: NeMo's FLOPs per token
  (nemo/utils/flops_formulas.py, `llama2`/`llama3`: 6 x the block matmuls and the head, attention as the full
  square, no recompute) x the predicted tokens/s/GPU;
- largest sequence (within 15%): `--max-seq`'s N.

Rows named in TUNING set a constant of the planner and are reported apart from the validation rows:
`--fit` solves for that constant on its row (bisection; the planner as it is otherwise) and prints it; the value
shipped in the planner is that, rounded.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import statistics
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "tests" / "benchmarks" / "data" / "published_runs.csv"
MAPPING = ROOT / "benchmarks" / "published_runs_plan.yaml"
TOLERANCE = {"peak_memory": 0.10, "tokens_per_s_per_gpu": 0.20, "max_seq_len": 0.15}
sys.path.insert(0, str(ROOT))
# row id -> the constant it set (dattn_cli/plan/context.py), on its throughput
TUNING: dict[str, str] = {"nemo-ls-llama2-7b-h100-256k": "CP_ATTENTION_EFFICIENCY"}
NCCL_ITEM = "NCCL buffers"


def mapped_rows(mapping: dict) -> list[tuple[dict, list[str] | None, str]]:
    """(row, plan argv or None, assumption or skip reason) for every row of the frozen table."""
    common = shlex.split(mapping.get("common", ""))
    out = []
    for row in pd.read_csv(ROWS, dtype=str).fillna("").to_dict("records"):
        entry = mapping.get(row["id"])
        if entry is None:
            out.append((row, None, "not in published_runs_plan.yaml"))
        elif "skip" in entry:
            out.append((row, None, entry["skip"]))
        else:
            argv = shlex.split(entry["args"]) + shlex.split(entry.get("extra", "")) + common
            if row["global_batch_tokens"]:
                argv += ["--global-batch-tokens", str(int(float(row["global_batch_tokens"])))]
            out.append((row, argv, entry.get("assume", "")))
    return out


class _Text(io.StringIO):
    encoding = "utf-8"  # the CLI reconfigures a stream whose encoding is not UTF-8


def run_plan(argv: list[str]) -> dict:
    """`dattn plan ARGV --json -` in this process (so --fit can set a constant): its JSON, or RuntimeError."""
    from dattn_cli.cli import main

    out, err, code = _Text(), _Text(), 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(["plan", *argv, "--json", "-"])
        except SystemExit as exc:
            code = exc.code or 0
    if code != 0:
        raise RuntimeError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {code}")
    return json.loads(out.getvalue())


def _item(plan: dict, prefix: str) -> float:
    return sum(v for k, v in plan["memory"]["items"].items() if k.startswith(prefix))


def predicted_memory_gib(plan: dict, kind: str) -> float | None:
    from dattn_cli.plan.memory import ALLOCATOR_MARGIN

    items = plan["memory"]["items"]
    context, nccl = items.get("framework", 0), _item(plan, NCCL_ITEM)
    tensors = (plan["memory"]["total"] - context - nccl) * (1 + ALLOCATOR_MARGIN)
    if kind == "reserved":
        return tensors / 2**30
    if kind == "nvidia-smi":
        return (tensors + context + nccl) / 2**30
    return None


def nemo_flops_per_token(problem: dict) -> float:
    """NeMo's model FLOPs per token (flops_formulas.py llama2/llama3): Megatron's convention without recompute."""
    from dattn_cli.plan.throughput import megatron_flops_per_token
    from dattn_cli.workload import Problem

    return megatron_flops_per_token(Problem(**problem), "none")


def compare(row: dict, plan: dict) -> list[dict]:
    """One record per metric the row publishes: published, predicted, relative error."""
    out = []

    def add(metric: str, published: float, predicted: float | None, unit: str) -> None:
        if predicted is None:
            return
        err = predicted / published - 1
        within = abs(err) <= TOLERANCE[metric]
        out.append(dict(metric=metric, unit=unit, published=published, predicted=predicted, error=err, within=within))

    if row["peak_memory_gib"]:
        add("peak_memory", float(row["peak_memory_gib"]), predicted_memory_gib(plan, row["memory_kind"]), "GiB")
    if row["tokens_per_s_per_gpu"]:
        add("tokens_per_s_per_gpu", float(row["tokens_per_s_per_gpu"]), plan["tokens_per_s_per_device"], "tok/s")
    elif row["tflops_per_gpu"]:
        tflops = plan["tokens_per_s_per_device"] * nemo_flops_per_token(plan["problem"]) / 1e12
        add("tokens_per_s_per_gpu", float(row["tflops_per_gpu"]), tflops, "model TFLOP/s (NeMo)")
    if row["max_seq_len"]:
        add("max_seq_len", float(row["max_seq_len"]), float(plan["problem"]["seq_len"]), "tokens")
    return out


def evaluate() -> tuple[list[dict], list[dict]]:
    """(records of planned rows' metrics, rows not planned with the reason)."""
    mapping = yaml.safe_load(MAPPING.read_text())
    records, skipped = [], []
    for row, argv, note in mapped_rows(mapping):
        if argv is None:
            skipped.append(dict(id=row["id"], reason=note))
            continue
        print(f"plan {row['id']}", file=sys.stderr, flush=True)
        try:
            plan = run_plan(argv)
        except RuntimeError as exc:
            skipped.append(dict(id=row["id"], reason=f"the planner refused: {exc}"))
            continue
        role = "tuning" if row["id"] in TUNING else "validation"
        for rec in compare(row, plan):
            where = plan["memory"].get("phase")
            records.append(dict(id=row["id"], role=role, **rec, phase=where, args=shlex.join(argv), assume=note))
    return records, skipped


def summary(records: list[dict]) -> list[dict]:
    out = []
    for role in ("validation", "tuning"):
        for metric, tol in TOLERANCE.items():
            errs = [r for r in records if r["role"] == role and r["metric"] == metric]
            if errs:
                within = sum(r["within"] for r in errs)
                median = statistics.median(abs(r["error"]) for r in errs)
                out.append(dict(role=role, metric=metric, rows=len(errs), within=within, tolerance=tol, median=median))
    return out


def markdown(records: list[dict], skipped: list[dict]) -> str:
    lines = ["| row | role | metric | published | predicted | error | within |", "|---|---|---|---:|---:|---:|---|"]
    for r in records:
        lines.append(
            f"| {r['id']} | {r['role']} | {r['metric']} ({r['unit']}) | {r['published']:,.4g} | {r['predicted']:,.4g} "
            f"| {r['error']:+.1%} | {'yes' if r['within'] else 'no'} |"
        )
    lines += ["", "| metric | role | rows | within tolerance | median abs error |", "|---|---|---:|---:|---:|"]
    for s in summary(records):
        share = s["within"] / s["rows"]
        lines.append(
            f"| {s['metric']} (+-{s['tolerance']:.0%}) | {s['role']} | {s['rows']} | {s['within']} ({share:.0%}) "
            f"| {s['median']:.1%} |"
        )
    lines += ["", "Not planned:", ""] + [f"- {s['id']}: {s['reason']}" for s in skipped]
    return "\n".join(lines)


def fit() -> dict[str, float]:
    """Each TUNING row's constant, solved so that its predicted throughput equals the published one."""
    from dattn_cli.plan import context

    mapping = yaml.safe_load(MAPPING.read_text())
    fitted = {}
    for row, argv, _ in mapped_rows(mapping):
        if row["id"] not in TUNING:
            continue
        shipped, lo, hi = context.CP_ATTENTION_EFFICIENCY, 0.05, 1.0
        try:
            for _ in range(40):
                context.CP_ATTENTION_EFFICIENCY = (lo + hi) / 2
                [rec] = [r for r in compare(row, run_plan(argv)) if r["metric"] == "tokens_per_s_per_gpu"]
                lo, hi = (
                    (lo, context.CP_ATTENTION_EFFICIENCY) if rec["error"] > 0 else (context.CP_ATTENTION_EFFICIENCY, hi)
                )
        finally:
            context.CP_ATTENTION_EFFICIENCY = shipped
        fitted[row["id"]] = (lo + hi) / 2
    return fitted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", type=Path, default=ROOT / "benchmarks" / "plan_published.jsonl")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument("--fit", action="store_true", help="solve the TUNING rows' constants and print them")
    a = ap.parse_args()
    if a.fit:
        for row, value in fit().items():
            print(f"{TUNING[row]} = {value:.4f}  (fitted on {row})")
        return
    records, skipped = evaluate()
    a.jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    if a.markdown:
        print(markdown(records, skipped))
        return
    for r in records:
        print(
            f"{r['id']:34s} {r['role']:10s} {r['metric']:22s} {r['published']:>12,.4g} {r['predicted']:>12,.4g} "
            f"{r['error']:+7.1%} {'ok' if r['within'] else 'MISS'}  ({r['phase']})"
        )
    for s in summary(records):
        print(
            f"{s['role']} {s['metric']}: {s['within']}/{s['rows']} within {s['tolerance']:.0%}, "
            f"median |error| {s['median']:.1%}"
        )
    print(f"not planned: {len(skipped)} rows", file=sys.stderr)


if __name__ == "__main__":
    main()
