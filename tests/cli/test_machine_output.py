"""`--json -` writes JSON alone to stdout: verify, plan, profile and env each piped into `python -m json.tool`
(a real pipe, with pipefail), tables and progress on stderr; `--csv -` piped into pandas the same way (bench's
pipes are in tests/cli/test_bench_cli.py)."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ["--seq-len", "256", "--segments", "64,128", "--dilations", "1,2", "--heads", "2", "--head-dim", "8"]


READ_CSV = "import pandas, sys; frame = pandas.read_csv(sys.stdin); print(len(frame), ','.join(frame.columns))"


def piped(*args: str, reader: str = "-m json.tool") -> subprocess.CompletedProcess:
    """`dattn ARGS | python READER`, run by bash with pipefail from the repository root."""
    cli = shlex.join([sys.executable, "-m", "dattn_cli", *args])
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{cli} | {shlex.quote(sys.executable)} {reader}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, on_stderr",
    [
        (
            ["verify", *SHAPE, "--impl", "ImprovedDilatedAttention", "--json", "-"],
            "verify passed: 1 check of B=1 N=256",
        ),
        (["plan", "--seq-len", "64k", "--json", "-"], "peak memory"),
        (["plan", "--check", "benchmarks/layer_cpu.jsonl", "--json", "-"], "memory error median"),
        (["profile", *SHAPE, "--iterations", "2", "--warmup", "1", "--json", "-"], "caches on"),
        (["env", "--json", "-"], "torch"),
    ],
    ids=["verify", "plan", "plan-check", "profile", "env"],
)
def test_json_to_stdout_pipes_into_json_tool(args, on_stderr):
    done = piped(*args)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # json.tool re-printed what dattn wrote: JSON and nothing else
    assert on_stderr in done.stderr  # the table went to stderr


@pytest.mark.slow
def test_machine_output_content():
    verify = json.loads(piped("verify", *SHAPE, "--impl", "ImprovedDilatedAttention", "--json", "-").stdout)
    assert verify["passed"] and {r["case"] for r in verify["results"]} == {"your configuration"}
    profile = json.loads(piped("profile", *SHAPE, "--iterations", "2", "--warmup", "1", "--json", "-").stdout)
    assert profile["config"]["problem"]["seq_len"] == 256 and profile["caches_on"]["calls"] == 3


@pytest.mark.slow
def test_profile_progress_one_line_per_setting_and_quiet():
    cmd = [sys.executable, "-m", "dattn_cli", "profile", *SHAPE, "--iterations", "2", "--warmup", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert [line.split(" ok ")[0] for line in lines] == [
        "[1/2] ImprovedDilatedAttention N=256 caches on",
        "[2/2] ImprovedDilatedAttention N=256 caches off",
    ]
    assert all(line.endswith(" ms") for line in lines)
    done = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "[1/2]" not in done.stderr and "caches on" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, lines, column",
    [
        (["verify", *SHAPE, "--impl", "ImprovedDilatedAttention", "--csv", "-"], 1, "errors.out.rel"),
        (["plan", "--seq-len", "64k", "--csv", "-"], 1, "memory.total"),
        (["plan", "--check", "benchmarks/layer_cpu.jsonl", "--csv", "-"], 20, "mem_error_pct"),
        (["profile", *SHAPE, "--iterations", "2", "--warmup", "1", "--csv", "-"], 2, "time.median_ms"),
        (["env", "--csv", "-"], 1, "torch_version"),
    ],
    ids=["verify", "plan", "plan-check", "profile", "env"],
)
def test_csv_to_stdout_pipes_into_pandas(args, lines, column):
    done = piped(*args, reader=f"-c {shlex.quote(READ_CSV)}")
    assert done.returncode == 0, done.stderr
    count, columns = done.stdout.split(" ", 1)
    assert int(count) == lines and column in columns.strip().split(","), done.stdout


def test_json_and_csv_cannot_both_take_stdout():
    done = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "env", "--json", "-", "--csv", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "wants stdout" in done.stderr and not done.stdout
