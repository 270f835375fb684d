"""benchmarks/plan_published.py: the planner against the frozen published multi-GPU runs (issue 29 part C)."""

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import plan_published  # noqa: E402


def test_every_frozen_row_is_planned_or_skipped_with_a_reason():
    mapping = yaml.safe_load(plan_published.MAPPING.read_text())
    rows = plan_published.mapped_rows(mapping)
    assert len(rows) == 65
    for row, argv, note in rows:
        assert argv is not None or (note and note != "not in published_runs_plan.yaml"), row["id"]
    assert set(plan_published.TUNING) <= {row["id"] for row, argv, _ in rows if argv is not None}


@pytest.fixture(scope="module")
def evaluated():
    return plan_published.evaluate()


def test_validation_rows_meet_the_targets(evaluated):
    """>= 10 memory, 10 throughput and 5 largest-sequence rows not used for tuning; >= 80% of each within 10%, 20%
    and 15%."""
    records, _ = evaluated
    summary = {(s["role"], s["metric"]): s for s in plan_published.summary(records)}
    for metric, least in (("peak_memory", 10), ("tokens_per_s_per_gpu", 10), ("max_seq_len", 5)):
        s = summary["validation", metric]
        assert s["rows"] >= least and s["within"] / s["rows"] >= 0.8, s
    assert all(r["role"] == "tuning" for r in records if r["id"] in plan_published.TUNING)


def test_the_shipped_constant_is_the_fitted_one():
    from dattn_cli.plan import context

    [(row, value)] = plan_published.fit().items()
    assert context.CP_ATTENTION_EFFICIENCY == pytest.approx(value, abs=0.005), row


def test_a_refused_row_is_reported_not_raised():
    with pytest.raises(RuntimeError, match="--tensor-parallel"):
        plan_published.run_plan(["--model", "llama-3.1-8b", "--devices", "8", "--tensor-parallel", "3"])
