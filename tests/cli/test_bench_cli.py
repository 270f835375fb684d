"""`dattn bench` and `dattn profile` from the command line."""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dattn_cli.bench import read_rows
from tests.cli.test_verify_env import run_cli

# a fixed --max-memory: the default (half of MemAvailable) depends on what else the host is doing
SMALL = [
    "--heads",
    "2",
    "--head-dim",
    "16",
    "--segments",
    "64,128",
    "--dilations",
    "1,2",
    "--repeat",
    "2",
    "--max-memory",
    "2GiB",
]


def test_bench_table_csv_json_out(tmp_path, capsys):
    out, js, csv = tmp_path / "r.jsonl", tmp_path / "r.json", tmp_path / "r.csv"
    code, stdout, err = run_cli(
        [
            "bench",
            "--impl",
            "ImprovedDilatedAttention",
            "--impl",
            "sdpa",
            "--seq-len",
            "256,512",
            *SMALL,
            "--out",
            str(out),
            "--json",
            str(js),
            "--csv",
            str(csv),
        ],
        capsys,
    )
    assert code == 0, err
    assert "ImprovedDilatedAttention" in stdout and "TFLOP/s" in stdout and "max N 512; all ok" in stdout
    # the ratio column against the sweep's dense baseline, and the fitted exponents under the table
    assert "x sdpa" in stdout and "ImprovedDilatedAttention: time ~ N^" in stdout and "sdpa: time ~ N^" in stdout
    assert csv.read_text().startswith("record,impl,semantics,dtype")
    rows = read_rows(out)
    failed = [(r.impl, r.seq_len, r.status, r.reason, r.error) for r in rows if r.status != "ok"]
    assert len(rows) == 4 and not failed, (failed, stdout, err)
    payload = json.loads(js.read_text())
    assert payload["environment"]["record"] == "environment" and len(payload["rows"]) == 4
    summary = payload["summaries"][0]
    assert summary["stopped_by"] is None and summary["summary"] == "max N 512; all ok"
    assert summary["time_exponent"] is not None


def dattn(*args: str) -> list[str]:
    return [sys.executable, "-m", "dattn_cli.cli", *args]


@pytest.mark.slow
def test_json_to_stdout_pipes_into_json_tool():
    cli = " ".join(dattn("bench", "--impl", "sdpa", "--seq-len", "256,512", *SMALL, "--json", "-"))
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{cli} | {sys.executable} -m json.tool"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [r["seq_len"] for r in json.loads(done.stdout)["rows"]] == [256, 512]
    assert "max N 512" in done.stderr  # the table went to stderr


@pytest.mark.slow
def test_csv_to_stdout_reads_with_pandas():
    import io

    import pandas

    done = subprocess.run(
        dattn("bench", "--impl", "sdpa", "--seq-len", "256,512", *SMALL, "--csv", "-"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    frame = pandas.read_csv(io.StringIO(done.stdout))
    assert list(frame["seq_len"]) == [256, 512] and list(frame["status"]) == ["ok", "ok"]


@pytest.mark.slow
def test_progress_is_one_line_per_point_without_a_terminal_and_quiet_silences_it():
    args = dattn("bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "256,512", *SMALL)
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)  # stderr a pipe, as in CI logs
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 2, done.stderr
    for line, (i, n) in zip(lines, ((1, "256"), (2, "512"))):
        assert re.fullmatch(rf"\[{i}/2\] ImprovedDilatedAttention N={n} ok [\d.,]+ ms", line), line
    quiet = subprocess.run([*args, "--quiet"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "max N 512" in quiet.stdout
    assert not [line for line in quiet.stderr.splitlines() if line.startswith("[")], quiet.stderr


def test_an_implementation_that_cannot_run_here_stops_before_the_sweep(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, stdout, err = run_cli(
        [
            "bench",
            "--impl",
            "ImprovedDilatedAttention",
            "--impl",
            "flash",
            "--seq-len",
            "256",
            *SMALL,
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("dattn: error: --impl flash cannot run with --device cpu")
    if importlib.util.find_spec("flash_attn") is None:
        assert "pip install 'dattn[flash]'" in err
    assert not out.exists() and stdout == ""  # nothing measured, not even the first implementation


@pytest.mark.parametrize(
    "target,options",
    [("layer", ["--embed-dim", "32"]), ("model", ["--embed-dim", "32", "--layers", "1", "--vocab-size", "64"])],
)
def test_layer_and_model_targets_default_to_the_multihead_module(target, options, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, stdout, err = run_cli(
        [
            "bench",
            "--target",
            target,
            *options,
            "--seq-len",
            "256",
            "--heads",
            "2",
            "--segments",
            "64,128",
            "--dilations",
            "1,2",
            "--repeat",
            "1",
            "--max-memory",
            "2GiB",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    rows = read_rows(out)
    assert [(r.impl, r.target, r.status) for r in rows] == [("ImprovedMultiheadDilatedAttention", target, "ok")], rows


def test_old_option_names_still_work_with_one_deprecation_note(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, _, err = run_cli(
        ["bench", "--impl", "sdpa", "--seq-lens", "256", *SMALL, "--out", str(out), "--quiet"], capsys
    )
    assert code == 0, err
    assert err.strip().splitlines() == ["dattn: note: --seq-lens is deprecated, use --seq-len"]
    assert [r.seq_len for r in read_rows(out)] == [256]


def _scaled(source, path, factor: float):
    """A copy of report `source` with every point's times (samples included) multiplied by `factor`."""
    with open(path, "w") as f:
        for rec in (json.loads(line) for line in source.read_text().splitlines()):
            if rec["record"] == "point":
                rec = {**rec, "time_ms": rec["time_ms"] * factor, "samples_ms": [t * factor for t in rec["samples_ms"]]}
            f.write(json.dumps(rec) + "\n")
    return path


LOAD_REASONS = ("other processes kept", "load average differs", "flagged noisy")


@pytest.mark.slow
def test_regression_gate_is_dattn_compare_exit_codes(tmp_path, capsys):
    """An established change decides the exit code, unless load differed between the runs (this run's points
    contended, other processes' CPU or the load average apart, as on a loaded test machine): then the gate
    must say inconclusive and name the load."""
    out = tmp_path / "base.jsonl"
    args = ["bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "512", *SMALL, "--repeat", "6"]
    assert run_cli([*args, "--out", str(out)], capsys)[0] == 0
    faster = _scaled(out, tmp_path / "faster.jsonl", 0.01)  # a baseline 100x faster: every point regressed
    slower = _scaled(out, tmp_path / "slower.jsonl", 100.0)  # 100x slower: none did, however loaded the machine is
    for baseline, code_if_clean, verdict in (
        (faster, 1, "verdict: slower (1 slower of 1 points)"),
        (slower, 0, "verdict: faster"),
    ):
        new = tmp_path / f"new-{baseline.name}"
        code, stdout, err = run_cli(
            [*args, "--out", str(new), "--baseline", str(baseline), "--fail-on-regression", "10"], capsys
        )
        load_named = any(reason in stdout + err for reason in LOAD_REASONS)
        if any(row.contended for row in read_rows(new)) or load_named:
            assert code == 3 and load_named, stdout + err
        else:
            assert code == code_if_clean and verdict in stdout, stdout + err


def test_regression_gate_with_too_few_samples_is_inconclusive_exit_3(tmp_path, capsys):
    out = tmp_path / "base.jsonl"
    args = ["bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "512", *SMALL, "--repeat", "2"]
    assert run_cli([*args, "--out", str(out)], capsys)[0] == 0
    code, stdout, err = run_cli(
        [*args, "--baseline", str(_scaled(out, tmp_path / "f.jsonl", 0.5)), "--fail-on-regression", "10"], capsys
    )
    assert code == 3 and "verdict: inconclusive" in stdout and "too few samples" in stdout + err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["bench"], "--impl: give at least one"),
        (["bench", "--impl", "nope", "--seq-len", "1k"], "--impl 'nope' is unknown"),
        (["bench", "--impl", "sdpa", "--seq-len", "4q"], "--seq-len: '4q' is not a length"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--max-memory", "lots"], "--max-memory: 'lots' is not a size"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--until-oom"], "exactly one of --seq-len and --until-oom"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--mode", "bwd"], "--mode 'bwd'"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--resume"], "--resume needs --out"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--fail-on-regression", "5"], "go together"),
        (["bench", "--impl", "sdpa", "--seq-len", "1k", "--segments", "8,x"], "--segments"),
        (["bench", "--impl", "flash", "--seq-len", "1k"], "--impl flash cannot run with --device cpu"),
        (["profile", "--mode", "both"], "--mode 'both'"),
        (["profile", "--impl", "sdpa"], "--impl sdpa is a baseline, with no pattern cache or memory pool to profile"),
    ],
)
def test_bad_bench_usage_is_one_line_exit_2(args, needle, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_profile_cli(tmp_path, capsys):
    js = tmp_path / "p.json"
    code, stdout, _ = run_cli(
        [
            "profile",
            "--seq-len",
            "256",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--segments",
            "64,128",
            "--dilations",
            "1,2",
            "--iterations",
            "3",
            "--json",
            str(js),
        ],
        capsys,
    )
    assert code == 0 and "pattern cache hit rate" in stdout
    report = json.loads(js.read_text())
    assert report["caches_on"]["pattern_cache"]["hits"] > 0 and report["caches_off"]["pattern_cache"]["hits"] == 0


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_same_rows_none_twice(tmp_path):
    out = tmp_path / "r.jsonl"
    lengths = ",".join(str(256 * i) for i in range(1, 13))
    cmd = [
        sys.executable,
        "-m",
        "dattn_cli.cli",
        "bench",
        "--impl",
        "ImprovedDilatedAttention",
        "--seq-len",
        lengths,
        *SMALL,
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_rows(out)) < 3:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI, its forkserver and the worker in flight
    proc.wait()
    before = read_rows(out)
    assert 3 <= len(before) < 12
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = read_rows(out)
    assert [r.seq_len for r in after] == [256 * i for i in range(1, 13)]
    assert len({r.key() for r in after}) == 12
    assert [r.model_dump() for r in after[: len(before)]] == [r.model_dump() for r in before]


@pytest.mark.slow
def test_bench_world_size_measures_ranks_and_counts_bytes(tmp_path, capsys):
    from dattn_cli.kernels.distributed.sequence_parallel import comm_volume

    out = tmp_path / "d.jsonl"
    code, stdout, err = run_cli(
        [
            "bench",
            "--impl",
            "RingDilatedAttention",
            "--impl",
            "DistributedImprovedDilatedAttention",
            "--world-size",
            "2",
            "--seq-len",
            "256,384",
            "--mode",
            "fwdbwd",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--segments",
            "64,256",
            "--dilations",
            "1,2",
            "--repeat",
            "1",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert "sent/call" in stdout
    rows = read_rows(out)
    ok = [r for r in rows if r.seq_len == 256]
    assert len(ok) == 2 and all(
        r.status == "ok" and r.world_size == 2 and len(r.peak_mem_bytes_per_rank) == 2 for r in ok
    )
    for row, strategy in zip(ok, ("ring", "allgather")):
        per_rank = comm_volume(strategy, 256, 2, 1, 2, 16, 4, [64, 256], [1, 2])
        assert row.comm_bytes_sent == max(c["forward_bytes_sent"] + c["backward_bytes_sent"] for c in per_rank)
    # N=384: shards of 192 would split the 256-segments unevenly, so each rank holds 256 of the sequence padded
    # to 512 (the padding masked): measured, its bytes those of the padded length with the mask
    padded = [r for r in rows if r.seq_len == 384]
    assert len(padded) == 2 and all(r.status == "ok" for r in padded)
    for row, strategy in zip(padded, ("ring", "allgather")):
        per_rank = comm_volume(strategy, 512, 2, 1, 2, 16, 4, [64, 256], [1, 2], with_mask=True)
        assert row.comm_bytes_sent == max(c["forward_bytes_sent"] + c["backward_bytes_sent"] for c in per_rank)


def test_bench_world_size_refuses_single_device_impls(capsys):
    code, _, err = run_cli(["bench", "--impl", "sdpa", "--world-size", "2", "--seq-len", "256"], capsys)
    assert code == 2 and "--world-size 2 runs distributed implementations only" in err


def test_interleaved_sweep_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, stdout, err = run_cli(
        [
            "bench",
            "--interleave",
            "--impl",
            "ImprovedDilatedAttention",
            "--impl",
            "sdpa",
            "--seq-len",
            "256,512",
            *SMALL,
            "--repeat",
            "4",
            "--mode",
            "fwd",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert "round-robin (--interleave)" in stdout and "x sdpa" in stdout
    rows = read_rows(out)
    assert [(r.impl, r.seq_len) for r in rows] == [
        ("ImprovedDilatedAttention", 256),
        ("sdpa", 256),
        ("ImprovedDilatedAttention", 512),
        ("sdpa", 512),
    ]
    assert all(r.interleaved and r.status == "ok" and len(r.samples_ms) == 4 and r.stopped_by == "repeat" for r in rows)


def test_adaptive_repeats_and_a_cold_cache(tmp_path, capsys):
    """Without --repeat: at least 10 timed calls, sampling stopped by the precision or the time budget (said
    why); --cache cold runs the same point with the cache overwritten before each call."""
    out = tmp_path / "r.jsonl"
    args = [
        "bench",
        "--impl",
        "sdpa",
        "--seq-len",
        "256",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--mode",
        "fwd",
        "--max-memory",
        "2GiB",
        "--max-seconds",
        "20",
    ]
    code, _, err = run_cli([*args, "--precision", "5", "--out", str(out)], capsys)
    assert code == 0, err
    (row,) = read_rows(out)
    assert row.repeat is None and row.precision == 5 and row.warmup_calls >= 1
    assert (row.stopped_by == "precision" and row.repeats >= 10 and row.median_ci_pct <= 5) or (
        row.stopped_by in ("max-seconds", "max-samples", "processes") and "not --precision 5%" in row.noisy_reason
    )
    cold = tmp_path / "cold.jsonl"
    code, _, err = run_cli([*args, "--repeat", "3", "--cache", "cold", "--out", str(cold)], capsys)
    assert code == 0, err
    cold_row = read_rows(cold)[0]
    assert cold_row.cache == "cold" and cold_row.repeats == 3
    assert cold_row.peak_mem_bytes < row.peak_mem_bytes + 16 * 2**20  # the 64 MiB flush buffer is not the point's


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--interleave", "--until-oom"], "--interleave times the lines"),
        (["--precision", "nan"], "--precision"),
        (["--precision", "0"], "--precision"),
        (["--cache", "lukewarm"], "--cache"),
    ],
)
def test_sampling_options_refused_with_one_line(extra, needle, capsys):
    args = ["bench", "--impl", "sdpa", "--heads", "2", "--head-dim", "16"]
    code, _, err = run_cli([*args, *extra] + ([] if "--until-oom" in extra else ["--seq-len", "256"]), capsys)
    assert code == 2 and needle in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile's CPU backend needs a C++ compiler",
)
def test_compile_measures_the_compiled_module_and_is_part_of_the_point(tmp_path):
    """bench --compile (issue 20 item 4): the module under torch.compile, compiled in the warm-up; the row says so,
    and compare keeps compiled and eager points apart (a key field)."""
    args = [
        "bench",
        "--impl",
        "ImprovedDilatedAttention",
        "--seq-len",
        "512",
        "--segments",
        "128,256",
        "--dilations",
        "1,2",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--mode",
        "fwdbwd",
        "--repeat",
        "3",
        "--warmup",
        "2",
        "-q",
    ]
    done = subprocess.run(
        dattn(*args, "--compile", "--out", str(tmp_path / "c.jsonl")), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    subprocess.run(
        dattn(*args, "--out", str(tmp_path / "e.jsonl")), capture_output=True, text=True, timeout=300, check=True
    )
    rows = read_rows(tmp_path / "c.jsonl") + read_rows(tmp_path / "e.jsonl")
    assert [(r.status, r.compiled) for r in rows] == [("ok", True), ("ok", False)]
    from dattn_cli.workload.records import point_key

    assert point_key(rows[0].model_dump()) != point_key(rows[1].model_dump())


def test_compile_is_refused_for_layers_with_one_line(capsys):
    from dattn_cli.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "--target", "layer", "--seq-len", "512", "--compile"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--compile applies to --target attention" in err and "Traceback" not in err
