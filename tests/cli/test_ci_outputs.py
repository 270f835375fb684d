"""CI outputs: verify --junit (JUnit XML, one test case per check, failures carried), --markdown for verify, bench
and compare, appended to $GITHUB_STEP_SUMMARY when that is set."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from dattn_cli.cli.render.ci import junit_xml
from dattn_cli.verify.report import CaseResult, Error, VerifyReport
from dattn_cli.workload.records import BenchRow

SHAPE = ["--seq-len", "256", "--segments", "64,128", "--dilations", "1,2", "--heads", "2", "--head-dim", "8"]


def dattn(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "dattn_cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_verify_junit_and_markdown(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    junit, markdown = tmp_path / "v.xml", tmp_path / "v.md"
    done = dattn(
        "verify",
        *SHAPE,
        "--impl",
        "ImprovedDilatedAttention",
        "--impl",
        "DilatedAttention",
        "--causal",
        "--junit",
        str(junit),
        "--markdown",
        str(markdown),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert done.returncode == 0, done.stderr
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "0"
    assert {s.get("name") for s in root.iter("testsuite")} == {"ImprovedDilatedAttention", "DilatedAttention"}
    assert len(list(root.iter("testcase"))) == int(root.get("tests")) == 2
    text = markdown.read_text()
    assert text.startswith("### dattn verify: passed") and "| ImprovedDilatedAttention |" in text
    assert summary.read_text().startswith("# earlier step\n### dattn verify: passed")  # appended, not replaced


def test_a_failed_check_is_a_junit_failure():
    bad = Error(abs=1.0, rel=0.5, limit=1e-5, passed=False)
    result = CaseResult(
        impl="Toy",
        case="c",
        backend="auto",
        semantics="longnet",
        causal=True,
        dtype="float32",
        device="cpu",
        batch=1,
        seq_len=8,
        heads=1,
        head_dim=4,
        segment_lengths=[4],
        dilation_rates=[1],
        uncovered_fraction=0.0,
        errors={"out": bad},
        passed=False,
        message="out above the limit",
    )
    root = ET.fromstring(junit_xml(VerifyReport(results=[result], passed=False, seed=0, skipped=["Ring: needs p > 1"])))
    failure = root.find("testsuite/testcase/failure")
    assert root.get("failures") == "1" and failure is not None and "out rel 5.00e-01" in failure.text
    assert root.find("testsuite[@name='skipped']/testcase/skipped") is not None


@pytest.mark.slow
def test_bench_and_compare_markdown(tmp_path):
    out, markdown = tmp_path / "r.jsonl", tmp_path / "b.md"
    done = dattn(
        "bench",
        "--impl",
        "sdpa",
        *SHAPE,
        "--repeat",
        "4",
        "--warmup",
        "0",
        "--quiet",
        "--out",
        str(out),
        "--markdown",
        str(markdown),
    )
    assert done.returncode == 0, done.stderr
    assert markdown.read_text().startswith("### dattn bench") and "| sdpa | 256 |" in markdown.read_text()
    rng = np.random.default_rng(0)
    row = [r for r in map(json.loads, out.read_text().splitlines()) if r["record"] == "point"][-1]
    for name, scale in (("a.jsonl", 1.0), ("b.jsonl", 1.0)):
        samples = list(10 * scale * rng.lognormal(0, 0.02, 15))
        (tmp_path / name).write_text(
            json.dumps(
                BenchRow(
                    **{
                        **row,
                        "samples_ms": samples,
                        "repeats": 15,
                        "noisy": False,
                        "noise": None,
                        "time_ms": float(np.median(samples)),
                    }
                ).model_dump()
            )
            + "\n"
        )
    done = dattn(
        "compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--threshold", "10", "--markdown", "-"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("### dattn compare: same") and "| sdpa | 256 |" in done.stdout
