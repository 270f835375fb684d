"""benchmarks/noise.py (issue 17, item 7): the slowdown writer, the load it starts and stops, its option errors,
an interrupted run, and one small pair of the slowdown scenario run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "noise.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from _noise_load import Intermittent, Spinners  # noqa: E402
from _noise_runs import write_slowed  # noqa: E402

TINY = [
    "--seq-len",
    "512",
    "--heads",
    "2",
    "--head-dim",
    "16",
    "--segments",
    "128,256",
    "--dilations",
    "1,2",
    "--repeat",
    "6",
]


def run_script(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def wait_gone(procs: list[psutil.Process], within: float) -> list[psutil.Process]:
    """The processes still running after `within` seconds (psutil checks the pid's start time too)."""
    until = time.monotonic() + within
    while time.monotonic() < until and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
        time.sleep(0.05)
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# --- the slowdown injected into a report ----------------------------------------------------------------------


def test_write_slowed_scales_times_of_point_rows_only(tmp_path):
    env = {"record": "environment", "host": "h", "load_average": [0.1, 0.2, 0.3]}
    ok = {
        "impl": "sdpa",
        "seq_len": 512,
        "status": "ok",
        "samples_ms": [10.0, 12.0, 11.0],
        "time_ms": 11.0,
        "time_ms_p10": 10.2,
        "time_ms_p90": 11.8,
        "tokens_per_s": 1000.0,
        "tflops": 0.5,
        "flops": 7.0,
        "noise": 0.1,
        "repeats": 3,
    }
    oom = {"record": "point", "impl": "sdpa", "seq_len": 1024, "status": "oom", "time_ms": None, "samples_ms": None}
    src, dst = tmp_path / "new.jsonl", tmp_path / "slow.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in (env, ok, oom, {"record": "run_end"})))

    assert write_slowed(src, dst, 1.25) == 2
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    assert out[0] == env and out[2] == oom and out[3] == {"record": "run_end"}
    slow = out[1]
    assert slow["samples_ms"] == pytest.approx([12.5, 15.0, 13.75])
    assert (slow["time_ms"], slow["time_ms_p10"], slow["time_ms_p90"]) == pytest.approx((13.75, 12.75, 14.75))
    assert (slow["tokens_per_s"], slow["tflops"]) == pytest.approx((800.0, 0.4))
    assert (slow["flops"], slow["noise"], slow["repeats"]) == (7.0, 0.1, 3)  # work and relative spread unchanged
    assert json.loads(src.read_text().splitlines()[1]) == ok  # the source is left as it was


# --- the load ----------------------------------------------------------------------------------------------


def test_spinners_busy_then_gone_after_stop():
    load = Spinners(2, 60).start()
    procs = [psutil.Process(pid) for pid in load.pids]
    try:
        assert len(procs) == 2 and all(p.is_running() for p in procs)
        assert sum(p.cpu_percent(0.3) for p in procs) > 50  # they spin
    finally:
        load.stop()
    assert wait_gone(procs, 0) == []
    assert load.pids == []


def test_spinners_end_by_themselves_at_their_deadline_and_with_their_parent():
    alone = Spinners(1, 0.5).start()
    proc = psutil.Process(alone.pids[0])
    assert wait_gone([proc], 10) == []
    alone.stop()
    # a parent killed without stopping them (as SIGKILL would): they end with it, long before their deadline
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from _noise_load import Spinners; import os; "
        "s = Spinners(2, 600).start(); print(*s.pids, flush=True); os._exit(0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks")], capture_output=True, text=True, timeout=60
    ).stdout.split()
    orphans = []
    for pid in map(int, out):
        try:
            orphans.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert wait_gone(orphans, 10) == []


def test_intermittent_load_comes_and_goes_and_is_gone_after_stop():
    load = Intermittent(1, 0.3, 0.3).start()
    time.sleep(1.5)
    load.stop()
    assert load.cycles >= 2 and len(load.pids_seen) >= 2
    seen = []
    for pid in load.pids_seen:
        try:
            seen.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert wait_gone(seen, 0) == []


# --- options and signals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, named",
    [
        (["--pairs", "0"], "--pairs"),
        (["--pairs", "two"], "--pairs"),
        (["--repeat", "3"], "--repeat"),
        (["--slowdown", "8"], "--slowdown"),
        (["--small-slowdown", "10"], "--small-slowdown"),
        (["--threshold", "-1"], "--threshold"),
        (["--load-period", "2"], "--load-period"),
        (["--load-procs", "1000"], "--load-procs"),
        (["--seq-len", "2q"], "--seq-len"),
        (["--interleave-seq-len", "8k,16k"], "--interleave-seq-len"),
        (["--scenario", "loud"], "--scenario"),
        (["--resume"], "--resume"),
    ],
)
def test_bad_option_is_one_line_exit_2(tmp_path, args, named):
    result = run_script(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").glob("*.jsonl"))


@pytest.mark.slow
def test_unknown_impl_refused_by_dattn_is_exit_2_and_leaves_no_results(tmp_path):
    result = run_script(
        "--scenario", "quiet", "--pairs", "1", "--impl", "NoSuchAttention", *TINY, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 2 and "NoSuchAttention" in result.stderr and "Traceback" not in result.stderr
    assert list((tmp_path / "results").glob("*.jsonl")) == []


def _cmdline(process: psutil.Process) -> list[str]:
    """Its command line; [] for a child that exited meanwhile (a zombie until reaped, or gone)."""
    try:
        return process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@pytest.mark.slow
def test_sigterm_stops_the_load_and_the_bench(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a long pair (no --repeat: adaptive) so that the loaded side is still running when the signal comes
    args = [*TINY[:-2], "--scenario", "loaded", "--pairs", "1", "--out", "r.jsonl"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    script = psutil.Process(proc.pid)
    try:
        until, spinners = time.monotonic() + 120, []
        while time.monotonic() < until and not spinners and proc.poll() is None:
            spinners = [c for c in script.children() if "getppid" in " ".join(_cmdline(c))]
            time.sleep(0.1)
        assert spinners, "the loaded side never started its load"
        family = script.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert wait_gone(family, 15) == []


# --- one small pair, as a user runs it ----------------------------------------------------------------------


@pytest.mark.slow
def test_slowdown_pair_detected_and_resume_measures_nothing(tmp_path):
    """One pair of scenario slowdown at N = 512 (~20 s on 2 busy cores): BASE and NEW measured, NEW's copy slowed
    by 25% compared with BASE, and by 5%. The verdict itself depends on the machine's load (a contended point
    is inconclusive), so only its kind is checked; rerunning with --resume measures nothing."""
    first = run_script("--scenario", "slowdown", "--pairs", "1", *TINY, "--out", "r.jsonl", cwd=tmp_path, timeout=300)
    assert first.returncode in (0, 1), first.stderr
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["record"] for r in records] == ["run", "pair", "summary"]
    pair = records[1]
    assert pair["exit_code"] in (0, 1, 3) and pair["small_exit_code"] in (0, 1, 3)
    assert pair["exit_code_unflagged"] in (0, 1, 3)  # compare's statistics alone, flags left out
    if pair["comparable"]:
        # samples x1.25 at threshold 10%: never 'same' or 'faster'; established (1) in >= 95% of such pairs, which
        # is noise.py's target, not one pair's: CI once saw a comparable pair come out inconclusive on a busy runner
        assert pair["exit_code"] in (1, 3), pair
    assert any(c.startswith("dattn bench ") for c in pair["commands"])
    assert any(c.startswith("dattn compare ") for c in pair["commands"])
    assert records[2]["targets"][0]["name"].startswith("25% slowdown")

    started = time.monotonic()
    again = run_script(
        "--scenario", "slowdown", "--pairs", "1", *TINY, "--out", "r.jsonl", "--resume", cwd=tmp_path, timeout=120
    )
    assert again.returncode == first.returncode and time.monotonic() - started < 30
    later = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["record"] for r in later] == ["run", "pair", "summary", "run", "summary"]
    refused = run_script("--scenario", "slowdown", "--pairs", "1", *TINY, "--out", "r.jsonl", cwd=tmp_path)
    assert refused.returncode == 2 and "--resume" in refused.stderr
