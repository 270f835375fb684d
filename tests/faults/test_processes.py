"""Issue 16, items 8 and 9: no process outlives dattn, and no stopped process hangs it.

* SIGKILL or SIGTERM of the dattn process ends its forkserver, its measurement worker and its ranks
  (each dies with its parent; SIGTERM also ends them on the way out), checked with psutil on every
  process that descended from dattn.
* A rank stopped (SIGSTOP) before or while it sends its result is named ("rank 1 did not report within
  N s") within the group's deadline; the ranks that reported, or that failed waiting for it, are not blamed.
  The same for a measurement worker stopped halfway through its result.

The launcher's scenarios run in a child Python (a hang fails the test at its timeout instead of hanging the
suite); rank functions live here, imported by the ranks by name."""

from __future__ import annotations

import inspect
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.faults.test_signals import ROOT, TINY, WAIT_S, assert_one_clean_line, start, stop, wait_until

# one point that runs for minutes unless stopped: the worker is alive whenever the parent is killed
LONG_POINT = [
    "bench",
    "--impl",
    "ImprovedDilatedAttention",
    "--seq-len",
    "4k",
    *TINY,
    "--repeat",
    "5000",
    "--max-seconds",
    "100000",
]
RANKS = [
    "bench",
    "--impl",
    "RingDilatedAttention",
    "--world-size",
    "2",
    "--seq-len",
    "4k",
    *TINY,
    "--repeat",
    "5000",
    "--max-seconds",
    "100000",
]
GONE_WITHIN_S = 15


def grandchildren(proc: subprocess.Popen) -> list[psutil.Process]:
    """Workers and ranks: dattn's descendants that are not its own children (the forkserver's children)."""
    try:
        return [p for p in psutil.Process(proc.pid).children(recursive=True) if p.ppid() != proc.pid]
    except psutil.NoSuchProcess:
        return []


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def kill_and_check_descendants(proc: subprocess.Popen, sig: int, workers: int) -> list[psutil.Process]:
    """Wait for `workers` grandchildren, send `sig` to dattn, return its descendants still running after
    GONE_WITHIN_S (killing them, so that a failing test leaves nothing behind)."""
    wait_until(lambda: len(grandchildren(proc)) >= workers or proc.poll() is not None, what="a worker")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    descendants = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    deadline = time.monotonic() + GONE_WITHIN_S
    while running(descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = running(descendants)
    for p in left:
        p.kill()
    return left


@pytest.mark.slow
@pytest.mark.parametrize("command,workers", [(LONG_POINT, 1), (RANKS, 2)], ids=["worker", "ranks"])
def test_sigkill_of_dattn_leaves_no_process_behind(command, workers):
    proc = start(command)
    left = kill_and_check_descendants(proc, signal.SIGKILL, workers)
    proc.communicate(timeout=WAIT_S)
    assert not left, [(p.pid, " ".join(p.cmdline())[:80]) for p in left]


@pytest.mark.slow
@pytest.mark.parametrize("command,workers", [(LONG_POINT, 1), (RANKS, 2)], ids=["worker", "ranks"])
def test_sigterm_of_dattn_ends_its_processes_and_says_so(command, workers):
    proc = start(command)
    left = kill_and_check_descendants(proc, signal.SIGTERM, workers)
    code, err = stop(proc, signal.SIGTERM)
    assert not left, [(p.pid, " ".join(p.cmdline())[:80]) for p in left]
    assert_one_clean_line(code, err, signal.SIGTERM)


# --- ranks and workers stopped by SIGSTOP -------------------------------------------------------------------


def _result_pipe():
    """The connection the launcher gave this process for its result (found in the caller's frames)."""
    frame = inspect.currentframe()
    while frame is not None:
        if "conn" in frame.f_locals:
            return frame.f_locals["conn"]
        frame = frame.f_back
    raise RuntimeError("no result pipe found")


def _stop_halfway_through_a_send() -> None:
    """Send the first bytes of a 1000-byte message, then stop: the parent holds a partial message."""
    os.write(_result_pipe().fileno(), struct.pack("!i", 1000) + b"partial")
    os.kill(os.getpid(), signal.SIGSTOP)


def rank_stops_while_sending(rank: int, world: int) -> int:
    if rank == 1:
        _stop_halfway_through_a_send()
    return rank


def rank_stops_before_a_collective(rank: int, world: int) -> float:
    import torch
    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def worker_stops_while_sending(conn) -> None:
    _stop_halfway_through_a_send()


def run_python(code: str, timeout: float = 90) -> str:
    """`code` in a child Python; its stdout. A hang fails here, at the timeout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: still waiting after {timeout} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["rank_stops_while_sending", "rank_stops_before_a_collective"])
def test_a_stopped_rank_is_named_within_the_deadline(fn):
    out = run_python(f"""
        import multiprocessing, time
        from dattn_cli.runtime.launch import DistributedError, run_distributed
        from tests.faults.test_processes import {fn}
        run_distributed({fn}, 1, timeout_s=5)  # the forkserver started before the clock starts
        began = time.monotonic()
        try:
            run_distributed({fn}, 2, timeout_s=4)
        except DistributedError as exc:
            print(exc)
        print("seconds", time.monotonic() - began)
        print("children left", len(multiprocessing.active_children()))
    """)
    message, seconds, left = out.strip().splitlines()[-3:]
    assert message.startswith("rank 1 did not report within"), message
    assert "stopped" in message and "rank 0" not in message, message
    assert float(seconds.split()[1]) < 4 + 4 + 10  # the group's timeout, its grace, and slack for a loaded host
    assert left == "children left 0"


@pytest.mark.slow
def test_a_worker_stopped_while_sending_its_result_becomes_a_row():
    out = run_python("""
        from dattn_cli.runtime.launch import run_isolated
        from tests.faults.test_processes import worker_stops_while_sending
        print(run_isolated(worker_stops_while_sending, (), deadline_s=3, deadline_text="3 s"))
    """)
    result = eval(out.strip().splitlines()[-1])
    assert result["status"] == "skipped" and result["reason"].startswith("time: point ran past 3 s; killed"), result
    assert "stopped" in result["reason"], result


@pytest.mark.slow
def test_verify_names_the_stopped_rank_not_its_peers(tmp_path):
    report = tmp_path / "v.json"
    proc = start(
        [
            "verify",
            "--impl",
            "StoppingRingAttention",
            "--world-size",
            "2",
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
            "--dist-timeout",
            "4",
            "--json",
            str(report),
        ],
        DATTN_PLUGINS="tests.faults.stopping_rank",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    try:
        out, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("verify hung on a stopped rank")
    assert proc.returncode == 1 and "Traceback" not in err, (out, err)
    [result] = json.loads(report.read_text())["results"]
    assert not result["passed"] and result["message"].startswith("rank 1 did not report within"), result
    assert "rank 0" not in result["message"], result
