"""The runs of benchmarks/noise.py: `dattn bench` and `dattn compare` as a user runs them (`python -m dattn_cli`
in a subprocess), the slowed copy of a report, and the facts read back from reports.

Each subprocess's stdout and stderr go to a log beside its report (--runs-dir); a subprocess that exits 2 is bad
input given to this script (BadInput, its last line quoted); one that fails otherwise or passes its time limit
makes only its pair an error (Failed). A run still going when the script is interrupted is stopped (SIGTERM:
dattn unwinds and stops its workers; SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

DATTN = [sys.executable, "-m", "dattn_cli"]
STOP_GRACE_S = 30.0
SCALED = ("time_ms", "time_ms_p10", "time_ms_p90")  # multiplied by the factor, with every value of samples_ms
INVERSE = ("tokens_per_s", "tflops")  # divided by it


class BadInput(Exception):
    """dattn refused an option this script passed on (exit 2): the message is its last line."""


class Failed(Exception):
    """A run gave no answer (crash, time limit, unexpected exit code): its pair is recorded as an error."""


def shown(cmd: list[str]) -> str:
    """The command as a user types it: `dattn ...` for `python -m dattn_cli ...`."""
    words = ["dattn", *cmd[len(DATTN) :]] if cmd[: len(DATTN)] == DATTN else cmd
    return shlex.join(str(w) for w in words)


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_logged(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> int:
    """Run `cmd` (with `env` added to this environment) with its output appended to `log`; its exit code.
    Stopped by SIGTERM (then SIGKILL) when the time limit passes or this process is interrupted meanwhile."""
    with open(log, "ab") as sink:
        sink.write(f"$ {shown(cmd)}\n".encode())
        sink.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env={**os.environ, **env} if env else None
        )
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise Failed(f"{shown(cmd)} did not finish within {timeout_s:.0f} s (stopped); see {log}") from None
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def complete(path: Path) -> bool:
    """A bench report that ran to its end (its last record is run_end)."""
    if not path.is_file():
        return False
    try:
        records = read_records(path)
    except (OSError, ValueError):
        return False
    return bool(records) and records[-1].get("record") == "run_end"


def write_slowed(src: Path, dst: Path, factor: float) -> int:
    """Copy the bench report `src` to `dst` with every point row slowed by `factor`: samples_ms, time_ms and its
    p10/p90 multiplied, tokens/s and TFLOP/s divided; other records and fields as they were. Returns the
    number of point rows scaled."""
    if not factor > 0:
        raise ValueError(f"the slowdown factor must be positive, got {factor}")
    out, scaled = [], 0
    for record in read_records(src):
        if record.get("record", "point") == "point":
            record = dict(record)
            if record.get("samples_ms"):
                record["samples_ms"] = [v * factor for v in record["samples_ms"]]
            for name in SCALED:
                if record.get(name) is not None:
                    record[name] *= factor
            for name in INVERSE:
                if record.get(name) is not None:
                    record[name] /= factor
            scaled += 1
        out.append(json.dumps(record))
    dst.write_text("\n".join(out) + "\n")
    return scaled


def point_rows(path: Path) -> list[dict]:
    return [r for r in read_records(path) if r.get("record", "point") == "point"]


def report_facts(path: Path) -> dict:
    """What the bench said about its own conditions: the most CPUs other processes kept busy during a point,
    and whether any point was flagged contended, throttled or noisy."""
    rows = point_rows(path)
    busy = [r["other_cpus"] for r in rows if r.get("other_cpus") is not None]
    return {
        "other_cpus": round(max(busy), 2) if busy else None,
        "contended": any(r.get("contended") for r in rows),
        "throttled": any(r.get("throttled") for r in rows),
        "noisy": sum(bool(r.get("noisy")) for r in rows),
        "points": len(rows),
    }


def statistical_exit(base: Path, new: Path, threshold_pct: float) -> int:
    """The exit code dattn compare's statistics alone give (0, 1 or 3): its library on the same reports with the
    bench's contention/throttle flags and the environment check left out. A diagnostic beside the CLI's answer:
    it shows whether the test or the flags keep a false alarm away."""
    from dattn_cli.compare.match import load_report, match_reports
    from dattn_cli.compare.report import EXIT_CODES, compare_pairs, overall

    pairs, _ = match_reports(load_report(base).points, load_report(new).points)
    bare = [(b.model_copy(update={"flag": None}), n.model_copy(update={"flag": None})) for b, n in pairs]
    return EXIT_CODES[overall(compare_pairs(bare, threshold_pct), True)]


class Runner:
    """Runs bench and compare for one script run; reports and logs go to `runs_dir`."""

    def __init__(
        self, workload: list[str], common: list[str], runs_dir: Path, timeout_s: float, env: dict | None = None
    ):
        """`workload`: --impl and --seq-len of the A/A runs; `common`: the options of every bench run; `env`:
        what every bench run's environment adds (e.g. OMP_NUM_THREADS)."""
        self.workload, self.common, self.runs_dir, self.timeout_s = workload, common, runs_dir, timeout_s
        self.env = env or {}
        runs_dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.runs_dir / f"{name}.jsonl"

    def bench(self, out: Path, load=None, workload: list[str] | None = None) -> str:
        """A fresh `dattn bench --out out` of `workload` (default: the A/A one), under `load` (a context
        manager) when given; its command line."""
        out.unlink(missing_ok=True)
        cmd = [*DATTN, "bench", *(workload or self.workload), *self.common, "--out", str(out), "-q"]
        log = out.with_suffix(".log")
        with load if load is not None else contextlib.nullcontext():
            code = run_logged(cmd, log, self.timeout_s, self.env)
        if code == 2:
            raise BadInput(last_line(log))
        if code != 0 or not complete(out):
            raise Failed(f"{shown(cmd)} exited {code}: {last_line(log)}")
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), shown(cmd)])

    def compare(self, base: Path, new: Path, name: str, threshold_pct: float) -> tuple[int, dict, str]:
        """`dattn compare BASE NEW --threshold T --json FILE`: its exit code, its JSON and its command line."""
        result = self.runs_dir / f"{name}.compare.json"
        result.unlink(missing_ok=True)
        cmd = [*DATTN, "compare", str(base), str(new), "--threshold", f"{threshold_pct:g}", "--json", str(result)]
        log = self.runs_dir / f"{name}.compare.log"
        code = run_logged(cmd, log, self.timeout_s)
        if code == 2:
            raise BadInput(last_line(log))
        if code not in (0, 1, 3) or not result.is_file():
            raise Failed(f"{shown(cmd)} exited {code}: {last_line(log)}")
        return code, json.loads(result.read_text()), shown(cmd)


def interleave_available() -> bool:
    """Whether this dattn's bench has --interleave (its --help lists it)."""
    env = {**os.environ, "COLUMNS": "200"}  # option names are never cut, but keep rich from wrapping oddly
    help_text = subprocess.run([*DATTN, "bench", "--help"], capture_output=True, text=True, timeout=120, env=env).stdout
    return "--interleave" in help_text
