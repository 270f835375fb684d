"""Schema checks for the frozen table of published multi-GPU long-context runs.

The table (tests/benchmarks/data/published_runs.csv) is literature data kept apart
from any tuning; PUBLISHED_RUNS.md beside it says where every value comes from.
These checks guard its shape only: they fit nothing and predict nothing.
"""

from pathlib import Path

import pandas as pd
import pytest

DATA = Path(__file__).parent / "data"
RUNS = DATA / "published_runs.csv"
EXCLUDED = DATA / "published_runs_excluded.csv"

COLUMNS = [
    "id",
    "source",
    "location",
    "model",
    "params_b",
    "gpu",
    "gpus",
    "gpus_per_node",
    "tp",
    "cp",
    "cp_kind",
    "pp",
    "dp",
    "zero",
    "recompute",
    "offload",
    "precision",
    "seq_len",
    "global_batch_tokens",
    "micro_batch",
    "peak_memory_gib",
    "memory_kind",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "mfu_convention",
    "max_seq_len",
    "metric_notes",
]
NUMERIC = [
    "params_b",
    "gpus",
    "gpus_per_node",
    "tp",
    "cp",
    "pp",
    "dp",
    "seq_len",
    "global_batch_tokens",
    "micro_batch",
    "peak_memory_gib",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "max_seq_len",
]
FRACTIONAL = {"params_b", "peak_memory_gib", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"}
INTEGER = [c for c in NUMERIC if c not in FRACTIONAL]
METRICS = ["peak_memory_gib", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "max_seq_len"]
CP_KINDS = {"ring", "allgather", "ulysses", "usp/hybrid", "none"}
MEMORY_KINDS = {"reserved", "allocated", "nvidia-smi", "unknown"}


def schema_problems(raw: pd.DataFrame) -> list[str]:
    """Every way the table breaks its schema, one line each (empty when it is sound)."""
    problems = []
    if list(raw.columns) != COLUMNS:
        return [f"columns {list(raw.columns)} differ from {COLUMNS}"]
    dup = raw["id"][raw["id"].duplicated()].tolist()
    if dup:
        problems.append(f"duplicate ids {dup}")
    for col in ("id", "source", "location", "model"):
        empty = raw["id"][raw[col].str.strip() == ""].tolist()
        if empty:
            problems.append(f"{col} empty in {empty}")
    num = {}
    for col in NUMERIC:
        values = pd.to_numeric(raw[col].replace("", None), errors="coerce")
        bad = raw["id"][(raw[col] != "") & values.isna()].tolist()
        if bad:
            problems.append(f"{col} does not parse as a number in {bad}")
        if col in INTEGER:
            frac = raw["id"][values.notna() & (values % 1 != 0)].tolist()
            if frac:
                problems.append(f"{col} is not a whole number in {frac}")
        num[col] = values
    num = pd.DataFrame(num)
    ids = raw["id"]

    def check(mask: pd.Series, what: str) -> None:
        bad = ids[mask.fillna(False)].tolist()
        if bad:
            problems.append(f"{what}: {bad}")

    check(num["gpus"].isna() | (num["gpus"] < 2), "gpus missing or < 2")
    check(num["seq_len"].isna() & num["max_seq_len"].isna(), "neither seq_len nor max_seq_len")
    check(num["seq_len"] < 8192, "seq_len < 8192")
    check(num["max_seq_len"] < 8192, "max_seq_len < 8192")
    for col in ("tp", "cp", "pp", "dp", "gpus_per_node", "micro_batch"):
        check(num[col] < 1, f"{col} < 1")
        check(num[col] > num["gpus"], f"{col} > gpus")
    given = num[["tp", "cp", "pp", "dp"]].notna().all(axis=1)
    product = num["tp"] * num["cp"] * num["pp"] * num["dp"]
    check(given & (product != num["gpus"]), "tp*cp*pp*dp != gpus")
    check(num["params_b"] <= 0, "params_b <= 0")
    check(num["peak_memory_gib"] <= 0, "peak_memory_gib <= 0")
    check(num["peak_memory_gib"] > 300, "peak_memory_gib > 300 (no GPU holds that)")
    check(num["tokens_per_s_per_gpu"] <= 0, "tokens_per_s_per_gpu <= 0")
    check(num["tflops_per_gpu"] <= 0, "tflops_per_gpu <= 0")
    check(num["tflops_per_gpu"] > 20000, "tflops_per_gpu > 20000")
    check((num["mfu"] <= 0) | (num["mfu"] > 1), "mfu outside (0, 1]")
    check(num["mfu"].notna() & (raw["mfu_convention"].str.strip() == ""), "mfu without mfu_convention")
    check(num["global_batch_tokens"] < num["seq_len"], "global_batch_tokens < seq_len")
    check(num[METRICS].isna().all(axis=1), "no metric (memory, throughput, mfu or max_seq_len)")
    check(~raw["cp_kind"].isin(CP_KINDS | {""}), f"cp_kind outside {sorted(CP_KINDS)}")
    check((num["cp"] > 1) & (raw["cp_kind"] == "none"), "cp > 1 with cp_kind none")
    check((num["cp"] == 1) & raw["cp_kind"].isin(CP_KINDS - {"none"}), "cp == 1 with a cp_kind")
    check(num["peak_memory_gib"].notna() & ~raw["memory_kind"].isin(MEMORY_KINDS), "memory without a memory_kind")
    check(num["peak_memory_gib"].isna() & (raw["memory_kind"] != ""), "memory_kind without memory")
    return problems


def load(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_published_runs_schema():
    raw = load(RUNS)
    assert len(raw) > 0
    assert schema_problems(raw) == []


def test_published_runs_counts():
    """The table serves as a held-out check: enough rows of each kind."""
    raw = load(RUNS)
    num = raw[METRICS].replace("", None).apply(pd.to_numeric)
    assert num["peak_memory_gib"].notna().sum() >= 10
    assert num[["tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"]].notna().any(axis=1).sum() >= 10
    assert num["max_seq_len"].notna().sum() >= 5


def test_excluded_schema():
    raw = load(EXCLUDED)
    assert list(raw.columns) == ["source", "location", "reason"]
    assert len(raw) > 0
    assert (raw.apply(lambda col: col.str.strip() != "")).all().all()


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("gpus", "1", "gpus missing or < 2"),
        ("seq_len", "4096", "seq_len < 8192"),
        ("dp", "3", "tp*cp*pp*dp != gpus"),
        ("peak_memory_gib", "-1", "peak_memory_gib <= 0"),
        ("tokens_per_s_per_gpu", "fast", "does not parse"),
        ("id", "torchtitan-t2-cp2", "duplicate ids"),
        ("location", "", "location empty"),
    ],
)
def test_schema_catches_a_broken_row(field, value, expect):
    raw = load(RUNS)
    broken = raw.iloc[[0]].copy()
    broken["id"] = "broken-row"
    broken[field] = value
    problems = schema_problems(pd.concat([raw, broken], ignore_index=True))
    assert any(expect in p for p in problems), problems


def test_schema_catches_a_row_without_metric():
    raw = load(RUNS)
    broken = raw.iloc[[0]].copy()
    broken["id"] = "no-metric"
    for col in METRICS + ["memory_kind"]:
        broken[col] = ""
    problems = schema_problems(pd.concat([raw, broken], ignore_index=True))
    assert any("no metric" in p for p in problems), problems
