"""Faults inside torchrun jobs (issue 33), run as a user runs them: `torchrun --no-python dattn ...` on gloo with
2 and 4 ranks, a fault injected on one rank at one point by tests/plugins/faulty_ring.py: SIGKILL of one rank,
SIGTERM of every rank (preemption), SIGSTOP of one rank, a restart under --max-restarts, one rank raising. Each
checks the lines dattn prints, the rows kept, the exit codes, the time from the fault to the last exit, and that
no process is left behind. NCCL runs the same code (runtime/heartbeat.py) but cannot be run here."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dattn_cli.runtime.launch import free_port

pytestmark = [
    pytest.mark.slow,  # torchrun worlds of 2 and 4 ranks: 10-50 s each
    pytest.mark.skipif(sys.platform != "linux", reason="torchrun over loopback: Linux"),
]
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 150
LENGTHS = "256,512,1024,2048"
BENCH = [
    "bench",
    "--impl",
    "FaultyRingAttention",
    "--seq-len",
    LENGTHS,
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--segments",
    "64,128",
    "--dilations",
    "1,2",
    "--mode",
    "fwd",
    "--repeat",
    "2",
    "--warmup",
    "0",
    "--max-seconds",
    "60",
    "--dist-timeout",
    "60",
    "--out",
    "r.jsonl",
]


def _dattn(tmp_path: Path) -> str:
    """The installed `dattn` console script; where this environment has none, the same script pip writes for
    `dattn = "dattn_cli.cli:main"`, so torchrun --no-python runs what a user's installation runs."""
    if found := shutil.which("dattn"):
        return found
    script = tmp_path / "bin" / "dattn"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom dattn_cli.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return str(script)


def _env(**extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "DATTN_FAULT"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    path = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "DATTN_PLUGINS": "tests.plugins.faulty_ring", **extra}


class Job:
    """One torchrun job: its ranks, its output, when its fault came and when its last process ended."""

    def __init__(self, tmp_path: Path, ranks: int, args: list[str], fault: str = "", restarts: int = 0):
        self.tmp_path, self.mark = tmp_path, tmp_path / "fault.mark"
        self.mark.unlink(missing_ok=True)
        cmd = [
            shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun"),
            "--nproc-per-node",
            str(ranks),
            "--max-restarts",
            str(restarts),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--no-python",
            _dattn(tmp_path),
            *args,
        ]
        env = _env(DATTN_FAULT=fault, DATTN_FAULT_MARK=str(self.mark)) if fault else _env()
        self.proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.seen: dict[int, psutil.Process] = {}
        self.started, self.ended = time.monotonic(), 0.0

    def processes(self) -> list[psutil.Process]:
        """Every process of the job seen so far (recorded as they appear: a rank that exits is still checked)."""
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def ranks(self) -> list[psutil.Process]:
        return [p for p in self.processes() if p.is_running() and "bench" in " ".join(_cmdline(p))]

    def wait_for_fault(self) -> float:
        deadline = time.monotonic() + WAIT_S
        while not self.mark.exists() or not self.mark.read_text().strip():
            self.processes()
            assert self.proc.poll() is None, self.finish()
            assert time.monotonic() < deadline, "the fault never came"
            time.sleep(0.1)
        self.processes()
        return float(self.mark.read_text().split()[0])

    def finish(self) -> tuple[int, str, str]:
        try:
            while self.proc.poll() is None:
                self.processes()
                time.sleep(0.1)
                if time.monotonic() > self.started + WAIT_S:
                    raise subprocess.TimeoutExpired(self.proc.args, WAIT_S)
            self.ended = time.time()
            out, err = self.proc.communicate(timeout=10)
        finally:
            self.kill_left()
        return self.proc.returncode, out, err

    def kill_left(self) -> list[int]:
        """Kill and name the job's processes still running once torchrun has returned (the test then fails)."""
        left = []
        for p in self.processes():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
                    p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        return left

    def left_behind(self) -> list[int]:
        gone, alive = psutil.wait_procs(self.processes(), timeout=2)
        return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _run(tmp_path: Path, ranks: int, args: list[str], fault: str = "", restarts: int = 0):
    return Job(tmp_path, ranks, args, fault, restarts)


def _rows(report: Path) -> list[dict]:
    return [r for r in map(json.loads, report.read_text().splitlines()) if r.get("record", "point") == "point"]


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dattn:")]


def _exit_codes(err: str) -> list[str]:
    """torchrun's summary of its ranks' exit codes ("exitcode  : 1 (pid: 123)")."""
    return re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", err, re.MULTILINE)


def test_a_killed_rank_is_named_within_seconds_and_resume_measures_the_rest(tmp_path):
    """4 ranks, rank 2 SIGKILLed at N=1024: the survivors (blocked in a collective with it) name it and its point,
    say what was kept, exit 1 without torchrun's SIGKILL, and torchrun returns within 25 s of the death."""
    job = _run(tmp_path, 4, BENCH, "kill:2:1024")
    died = job.wait_for_fault()
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code != 0 and job.ended - died < 25, (job.ended - died, err[-3000:])
    lines = _lines(err)
    assert lines == [
        "dattn: error: rank 2 (at FaultyRingAttention N=1,024) died: its heartbeat stopped; the other ranks stop too",
        "dattn: 2 points kept in r.jsonl; rerun with --resume",
    ], err[-3000:]
    assert sorted(_exit_codes(err)) == ["-9", "1", "1", "1"], err[-3000:]  # only the killed rank died of SIGKILL
    assert [r["seq_len"] for r in _rows(tmp_path / "r.jsonl")] == [256, 512]
    code, _, err = _run(tmp_path, 4, [*BENCH, "--resume"]).finish()
    assert code == 0, err[-3000:]
    rows = _rows(tmp_path / "r.jsonl")
    assert sorted(r["seq_len"] for r in rows) == [256, 512, 1024, 2048] and all(r["status"] == "ok" for r in rows)


def test_sigterm_to_every_rank_keeps_whole_rows_and_resume_measures_only_the_rest(tmp_path):
    """Preemption: SIGTERM to every rank at once while rank 0 waits in a collective (rank 1 held):
    exit 143 on every rank, every row whole, one line of what was kept; --resume measures only what is missing."""
    job = _run(tmp_path, 2, BENCH, "hold:1:1024")
    job.wait_for_fault()
    time.sleep(1.0)  # rank 0 is in the collective by now
    ranks = job.ranks()
    assert len(ranks) == 2
    terminated = time.time()
    for p in ranks:  # as SLURM's step kill; torchrun then reports each rank's exit code
        p.send_signal(signal.SIGTERM)
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code != 0 and job.ended - terminated < 15, (job.ended - terminated, err[-3000:])
    assert _lines(err) == [
        "dattn: interrupted: the job was terminated (SIGTERM) at FaultyRingAttention N=1,024",
        "dattn: 2 points kept in r.jsonl; rerun with --resume",
    ], err[-3000:]
    assert _exit_codes(err) == ["143", "143"], err[-3000:]
    before = _rows(tmp_path / "r.jsonl")
    assert [r["seq_len"] for r in before] == [256, 512]
    code, _, err = _run(tmp_path, 2, [*BENCH, "--resume"]).finish()
    assert code == 0, err[-3000:]
    rows = _rows(tmp_path / "r.jsonl")
    assert [r["seq_len"] for r in rows] == [256, 512, 1024, 2048] and rows[:2] == before


def test_a_stopped_rank_is_named_and_the_launcher_kills_it(tmp_path):
    """Rank 1 SIGSTOPs itself at N=1024: its heartbeat stops, rank 0 names it and leaves (exit 1); torchrun then
    SIGTERMs the stopped rank and SIGKILLs it after its 30 s grace. Nothing is left behind."""
    job = _run(tmp_path, 2, BENCH, "stop:1:1024")
    stopped = job.wait_for_fault()
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code != 0 and job.ended - stopped < 60, (job.ended - stopped, err[-3000:])
    assert _lines(err)[0].startswith("dattn: error: rank 1 (at FaultyRingAttention N=1,024) died"), err[-3000:]
    assert _lines(err)[1] == "dattn: 2 points kept in r.jsonl; rerun with --resume", err[-3000:]
    assert sorted(_exit_codes(err)) == ["-9", "1"], err[-3000:]  # the stopped rank alone needed SIGKILL


def test_a_restarted_group_resumes_without_duplicate_rows(tmp_path):
    """--max-restarts 1: rank 1 dies at N=1024 in the first attempt; the restarted group (TORCHELASTIC_RESTART_COUNT
    1) resumes the report without --resume, says so in one line, and every point appears once."""
    job = _run(tmp_path, 2, BENCH, "kill:1:1024", restarts=1)
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code == 0, err[-3000:]
    assert "dattn: note: restart 1 of this torchrun group: resuming r.jsonl" in _lines(err), err[-3000:]
    rows = _rows(tmp_path / "r.jsonl")
    assert [r["seq_len"] for r in rows] == [256, 512, 1024, 2048] and all(r["status"] == "ok" for r in rows)


@pytest.mark.parametrize("fault", ["raise", "oom"])
def test_one_rank_raising_is_a_row_or_a_line_never_a_hang(tmp_path, fault):
    """Bad input on rank 1 alone (or a CUDA out-of-memory error, raised on CPU): rank 0, held in a collective
    rank 1 never enters, leaves within seconds (not --dist-timeout's 60 s) naming rank 1 and its error."""
    job = _run(tmp_path, 2, BENCH, f"{fault}:1:1024")
    failed = job.wait_for_fault()
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code != 0 and job.ended - failed < 40, (job.ended - failed, err[-3000:])
    said = (
        "ValueError: injected bad input on rank 1"
        if fault == "raise"
        else "OutOfMemoryError: CUDA out of memory (injected on rank 1)"
    )
    rows = _rows(tmp_path / "r.jsonl")
    named = [r for r in rows if r["seq_len"] == 1024 and "rank 1" in (r.get("error") or "")]
    lines = _lines(err)
    held = f"dattn: error: rank 1 failed: FaultyRingAttention N=1024: {said}; this rank was held in a collective"
    assert named or lines[:2] == [held, "dattn: 2 points kept in r.jsonl; rerun with --resume"], (rows, lines)
    assert [r["seq_len"] for r in rows if r["status"] == "ok"] == [256, 512], rows
    assert "Traceback" not in "\n".join(line for line in err.splitlines() if "dattn" in line)


def test_verify_says_how_many_checks_were_done(tmp_path):
    """verify under torchrun, rank 1 killed in its first check: rank 0 names it and says what verify kept."""
    args = ["verify", "--impl", "FaultyRingAttention", "--seq-len", "256", "--heads", "2", "--head-dim", "8"]
    args += ["--segments", "64,128", "--dilations", "1,2", "--dist-timeout", "60", "--json", "v.json"]
    job = _run(tmp_path, 2, args, "kill:1:256")
    died = job.wait_for_fault()
    code, _, err = job.finish()
    assert job.left_behind() == [], err[-2000:]
    assert code != 0 and job.ended - died < 25, (job.ended - died, err[-3000:])
    lines = _lines(err)
    assert lines[0].startswith("dattn: error: rank 1 (at verify FaultyRingAttention") and "died" in lines[0], lines
    assert lines[1] == "dattn: 0 check(s) done, none failed so far; no report written", lines
    assert not (tmp_path / "v.json").exists()


def test_profile_is_refused_in_one_line_under_a_launcher(tmp_path):
    args = ["profile", "--impl", "DilatedAttention", "--seq-len", "256", "--segments", "64,128", "--dilations", "1,2"]
    code, _, err = _run(tmp_path, 2, args).finish()
    assert code != 0
    # rank 1 may get torchrun's SIGTERM (after rank 0's exit) before it reaches the refusal: it then says it was
    # interrupted, which is true; the refusal itself is said once, by rank 0
    assert [line for line in _lines(err) if line != "dattn: interrupted"] == [
        "dattn: error: profile: runs in one process and does not join a launcher's world (torchrun started 2 "
        "ranks): run `dattn profile` without torchrun, or with one process"
    ], err[-2000:]
