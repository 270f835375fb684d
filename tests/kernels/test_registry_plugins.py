"""One ImplSpec is all a new implementation needs: a toy registered from outside dattn (DATTN_PLUGINS) is
listed by `dattn impls`, checked by `dattn verify`, measured by `dattn bench` (in its isolated worker) and
planned by `dattn plan`, with no other edit. Each command runs as a user runs it, in a fresh process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = "ToyDilatedAttention"
SMALL = ["--heads", "2", "--head-dim", "16", "--segments", "128,256", "--dilations", "1,2"]


def dattn(*args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DATTN_PLUGINS": "tests.plugins.toy_attention",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "dattn_cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_impls_lists_the_toy():
    done = dattn("impls")
    assert done.returncode == 0, done.stderr
    assert TOY in done.stdout


@pytest.mark.slow
def test_verify_checks_the_toy_against_the_reference():
    done = dattn("verify", "--impl", TOY, "--json", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert TOY in done.stdout and "FAIL" not in done.stdout


@pytest.mark.slow
def test_bench_measures_the_toy_in_its_worker(tmp_path):
    out = tmp_path / "r.jsonl"
    done = dattn(
        "bench", "--impl", TOY, "--seq-len", "512", *SMALL, "--repeat", "1", "--max-memory", "1GiB", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines() if '"point"' in line]
    assert [(r["impl"], r["status"]) for r in rows] == [(TOY, "ok")], rows
    assert rows[0]["flops"] > 0 and rows[0]["predicted_mem_bytes"] > 0


def test_plan_predicts_the_toy(tmp_path):
    out = tmp_path / "p.json"
    done = dattn("plan", "--impl", TOY, "--seq-len", "16k", *SMALL, "--json", str(out))
    assert done.returncode == 0, done.stderr
    plan = json.loads(out.read_text())
    assert plan["problem"]["impl"] == TOY and plan["feasible"] and plan["memory"]["total"] > 0


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--impl", "nonsense", "--profile", "h100-sxm-80gb", "--seq-len", "4096"],
        ["bench", "--impl", "nonsense", "--seq-len", "1k"],
        ["profile", "--impl", "nonsense"],
    ],
)
def test_an_unknown_implementation_is_one_line_listing_the_known_ones(command):
    done = dattn(*command)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nonsense" in lines[0] and "ImprovedDilatedAttention" in lines[0] and TOY in lines[0]
