"""`dattn compare`: two reports point by point, or --a/--b in one report; exit 0 same/faster, 1 slower (established),
2 bad input, 3 inconclusive; --json and --csv machine output."""

import json
import subprocess
import sys

import numpy as np
import pytest

from dattn_cli.workload.records import BenchRow

POINT = dict(
    semantics="longnet",
    dtype="float32",
    device="cpu",
    batch=1,
    heads=2,
    head_dim=16,
    seq_len=1024,
    segments=[256, 512],
    dilations=[1, 2],
    causal=False,
    mode="fwd",
    status="ok",
    repeat=15,
    warmup=1,
)


def report(path, *impls_and_scales, seed=0, n=15):
    """A bench-like report: one environment record, one row per (impl, slowdown) with lognormal samples."""
    rng = np.random.default_rng(seed)
    lines = [{"record": "environment", "hostname": "ci", "torch_version": "2.13.0+cpu", "config": {"threads": 2}}]
    for impl, scale in impls_and_scales:
        samples = list(10.0 * scale * rng.lognormal(0.0, 0.03, n))
        lines.append(
            BenchRow(impl=impl, **POINT, time_ms=float(np.median(samples)), repeats=n, samples_ms=samples).model_dump()
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def dattn(*args):
    return subprocess.run(
        [sys.executable, "-m", "dattn_cli", "compare", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_the_same_speed_is_same_and_exit_0(tmp_path):
    base = report(tmp_path / "a.jsonl", ("sdpa", 1.0), seed=1)
    new = report(tmp_path / "b.jsonl", ("sdpa", 1.0), seed=2)
    done = dattn(base, new, "--threshold", "10", "--json", "-")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["verdict"] == "same" and out["points"][0]["ratio"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
def test_a_25_percent_slowdown_is_slower_and_exit_1(tmp_path):
    base = report(tmp_path / "a.jsonl", ("sdpa", 1.0), seed=1)
    new = report(tmp_path / "b.jsonl", ("sdpa", 1.25), seed=2)
    done = dattn(base, new, "--threshold", "10", "--csv", "-")
    assert done.returncode == 1, done.stderr
    assert "slower" in done.stdout.splitlines()[1] and "verdict: slower" in done.stderr


@pytest.mark.slow
def test_two_implementations_of_one_run(tmp_path):
    run = report(tmp_path / "run.jsonl", ("ImprovedDilatedAttention", 0.5), ("sdpa", 1.0))
    done = dattn(run, "--a", "ImprovedDilatedAttention", "--b", "sdpa", "--json", "-")
    assert done.returncode == 0, done.stderr
    point = json.loads(done.stdout)["points"][0]
    assert point["verdict"] == "faster" and point["ci_low"] < point["ratio"] < point["ci_high"] < 0.6


@pytest.mark.slow
def test_environments_that_differ_are_inconclusive_exit_3(tmp_path):
    base = report(tmp_path / "a.jsonl", ("sdpa", 1.0), seed=1)
    new_path = tmp_path / "b.jsonl"
    report(new_path, ("sdpa", 1.5), seed=2)
    new_path.write_text(new_path.read_text().replace('"hostname": "ci"', '"hostname": "laptop"'))
    done = dattn(base, str(new_path))
    assert done.returncode == 3, done.stderr
    assert "laptop" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        (["only-one.jsonl"], "give two reports"),
        (["a.jsonl", "b.jsonl", "c.jsonl"], "give two reports"),
        (["missing.jsonl", "missing2.jsonl"], "no such file"),
        (["a.jsonl", "--a", "sdpa"], "--a IMPL --b IMPL"),
        (["a.jsonl", "a.jsonl", "--threshold", "nan"], "--threshold"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, needle):
    report(tmp_path / "a.jsonl", ("sdpa", 1.0))
    monkeypatch.chdir(tmp_path)
    done = dattn(*args)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
