"""Sweeps: fixed sequence lengths, or --until-oom (double, then bisect), one isolated worker per point."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from ..runtime.signals import Interrupted, deferred
from ..workload.problem import Problem
from ..workload.records import BenchRow, pattern_fields, point_key, row_fields, rows_with_settings, settings_mismatch
from ..workload.reportfile import ReportFile
from .config import Sweep
from .processes import run_in_processes
from .summary import PREDICTED, ImplSummary, scaling_exponents, stop_reason, summarize
from .worker import make_row, run_distributed_point, run_isolated, run_isolated_group

Runner = Callable[[Sweep, Problem], dict]
GroupRunner = Callable[[Sweep, list[Problem]], list[dict]]  # --interleave: the lines of one N together
Predict = Callable[[Problem], "int | None"]

FAILED = ("oom", "error", "skipped")
BISECT_TOLERANCE = 0.05
# A point is skipped unrun only when the planner's prediction is clearly above the cap; near the cap the
# measurement decides (a measured peak above --max-memory makes the row oom), so --until-oom limits are
# measured, not predicted.
PREDICTION_MARGIN = 1.25
MAX_DOUBLINGS = 24


class SweepResult(BaseModel):
    rows: list[BenchRow]
    summaries: list[ImplSummary]
    environment: dict | None = None  # this run's environment record, with the load average at its end


def end_record() -> dict:
    """The record closing a run in its report: the load average at the end (the start's is in the environment
    record), so `dattn compare` sees load that came during the run."""
    from ..runtime.contention import load_average

    return {"record": "run_end", "load_average": load_average()}


def environment_record(cfg: Sweep, command: list[str] | None) -> dict:
    from ..runtime.envinfo import collect_environment

    env = collect_environment().model_dump()
    env["torch_threads"] = cfg.threads  # what the workers run with, not this process
    return {
        "record": "environment",
        **env,
        "seed": cfg.seed,
        "command": command or ["dattn", *sys.argv[1:]],
        "config": cfg.model_dump(),
    }


MEMORY_LIMITS = ("memory", "prediction")  # what until-oom bisects towards


def run_points(sweep: Sweep, problem: Problem) -> dict:
    """A single-process point in --processes fresh workers (bench.processes)."""
    return run_in_processes(sweep, problem, run_isolated)


def _would_measure(sweep: Sweep, row: BenchRow) -> bool:
    """Is `row`'s point one this sweep measures (same problem; a length it sweeps)?"""
    if not sweep.until_oom and row.seq_len not in sweep.seq_lens:
        return False
    for line in sweep.variants(row.impl) if row.impl in sweep.impls else []:
        try:
            if point_key(row_fields(line.with_(seq_len=row.seq_len))) == row.key():
                return True
        except ValueError:  # a length this line cannot take
            continue
    return False


def _start_report(report: ReportFile, sweep: Sweep, resume: bool, environment: dict) -> dict[tuple, BenchRow]:
    """Read what `report` holds, refuse what cannot be continued, repair a cut-off last line, append this run's
    environment record; the points already measured (resume) by key."""
    rows = rows_with_settings(report.path)
    report.points = len(rows)
    if rows and not resume:
        raise ValueError(f"--out {report.path} already holds rows: pass --resume to continue it, or choose a new file")
    settings = sweep.settings()
    for number, row in rows:
        if (differs := settings_mismatch(row, settings)) and _would_measure(sweep, row):
            raise ValueError(
                f"--resume: {report.path}:{number} ({row.impl} N={row.seq_len:,}) was measured with "
                f"{differs}: resume with the report's settings, or write a new --out"
            )
    if note := report.repair_tail():
        print(f"dattn: note: {note}", file=sys.stderr)
    report.append(environment)
    return {row.key(): row for _, row in rows}


@dataclass
class _Sweeper:
    sweep: Sweep
    report: ReportFile | None
    done: dict[tuple, BenchRow]
    on_row: Callable[[BenchRow], None] | None
    runner: Runner
    predict: Predict | None
    group_runner: GroupRunner
    line: Problem | None = None  # the problem of the line being measured (impl, density)
    rows: list[BenchRow] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.settings = self.sweep.settings()

    def point(self, n: int, blocked: str | None = None) -> BenchRow:
        problem = self.line.with_(seq_len=n)
        if (row := self.measured(problem)) is not None:
            return row
        predicted = self.predict(problem) if self.predict else None
        result = self.before_running(predicted, blocked) or self.checked(self.runner(self.sweep, problem))
        return self.record(problem, result, predicted)

    def measured(self, problem: Problem) -> BenchRow | None:
        """The row of `problem` from an earlier, interrupted run (resume), counted as this run's; else None."""
        row = self.done.get(point_key(row_fields(problem)))
        if row is not None:
            self.rows.append(row)
        return row

    def record(self, problem: Problem, result: dict, predicted: int | None) -> BenchRow:
        row = make_row(problem, result, predicted).model_copy(update=self.settings)
        with deferred():  # a row is written and counted whole, or not at all, whenever a signal comes
            if self.report is not None:
                self.report.append(row.model_dump())
            self.rows.append(row)
            self.done[row.key()] = row
        if self.on_row:
            self.on_row(row)
        return row

    def before_running(self, predicted: int | None, blocked: str | None) -> dict | None:
        """The row result of a point not worth running (after a failure; predicted far above the cap); else None."""
        cap = self.sweep.max_memory
        if blocked:
            return {"status": "skipped", "reason": blocked}
        if not self.sweep.cuda and predicted is not None and predicted > PREDICTION_MARGIN * cap:
            return {
                "status": "skipped",
                "reason": f"{PREDICTED} {predicted / 2**30:.2f} GiB, more than "
                f"{PREDICTION_MARGIN:g} x --max-memory {cap / 2**30:.2f} GiB",
            }
        return None

    def checked(self, result: dict) -> dict:
        """A CPU point whose measured peak is above --max-memory is an oom row."""
        cap, measured = self.sweep.max_memory, result.get("peak_mem_bytes")
        if not self.sweep.cuda and result.get("status") == "ok" and measured and measured > cap:
            result = {
                **result,
                "status": "oom",
                "reason": f"measured peak {measured / 2**30:.2f} GiB above --max-memory {cap / 2**30:.2f} GiB",
            }
        return result

    def fixed(self) -> ImplSummary:
        rows: list[BenchRow] = []
        for n in self.sweep.seq_lens:
            rows.append(self.point(n, blocked=_blocked(rows)))
        return _line_summary(self.line.impl, rows)

    def until_oom(self) -> ImplSummary:
        """Double N from --start-seq-len until a point fails; bisect to 5% only below a memory limit: a measured
        one (oom), or the memory prediction (a point predicted far above the cap, skipped unrun; the summary
        says the limit was predicted, not measured). A point skipped for time, or an error, stops the search
        where it is: neither is a memory limit."""
        impl, ok, n = self.line.impl, None, self.sweep.start
        for _ in range(MAX_DOUBLINGS):
            row = self.point(n)
            if row.status != "ok":
                break
            ok, n = n, n * 2
        else:
            return ImplSummary(
                impl=impl,
                max_ok_seq_len=ok,
                stopped_by="doublings",
                limit=f"stopped after {MAX_DOUBLINGS} doublings, every length ran ok",
            )
        if stop_reason(row) not in MEMORY_LIMITS:
            return summarize(impl, ok, row)
        oom = row
        while ok is not None and oom.seq_len - ok > BISECT_TOLERANCE * oom.seq_len:
            row = self.point(_round_mid(ok, oom.seq_len))
            if row.status == "ok":
                ok = row.seq_len
            elif stop_reason(row) in MEMORY_LIMITS:
                oom = row
            else:  # e.g. over --max-seconds below the memory limit: report that, and the oom above it
                return summarize(impl, ok, row, extra=f"; oom at N={oom.seq_len:,}")
        return summarize(impl, ok, oom)


def _first_failure(rows: list[BenchRow]) -> BenchRow | None:
    return next((r for r in rows if r.status != "ok"), None)


def _blocked(rows: list[BenchRow]) -> str | None:
    """Why a fixed sweep skips the line's next length: its first failure (None while every row is ok)."""
    stop = _first_failure(rows)
    return f"after {stop.status} at N={stop.seq_len}" if stop else None


def _line_summary(impl: str, rows: list[BenchRow]) -> ImplSummary:
    """How far a line of a fixed sweep got (its longest ok N) and what stopped it (its first failure)."""
    return summarize(impl, max((r.seq_len for r in rows if r.status == "ok"), default=None), _first_failure(rows))


def _round_mid(lo: int, hi: int) -> int:
    """Midpoint rounded to a multiple of 64 while the gap allows it (any N is legal for every impl)."""
    mid = (lo + hi) // 2
    if hi - lo > 256:
        mid = mid // 64 * 64
    return min(max(mid, lo + 1), hi - 1)


def run_sweep(
    sweep: Sweep,
    *,
    out: Path | None = None,
    resume: bool = False,
    command: list[str] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
    runner: Runner | None = None,
    predict: Predict | None = None,
    on_report: Callable[[ReportFile], None] | None = None,
    group_runner: GroupRunner | None = None,
) -> SweepResult:
    """Measure every implementation over the configured lengths; rows go to `out` as they come.
    `predict(problem)`: predicted peak bytes for the row (the planner's, passed in by the caller); points
    predicted above 1.25 x --max-memory are skipped unrun on CPU.

    `out` is checked and locked before anything is measured (ValueError: not a writable regular file, or
    being written by another process); `resume` continues it (points measured with other settings are
    refused, naming the setting). A failed write raises workload.reportfile.ReportWriteError, the rows before
    it intact. `on_report(report)` is called once the report is open: its `path` and `points` (point rows
    now in it) stay current while the sweep runs, e.g. for a message after an interrupt. A signal (Interrupted,
    or KeyboardInterrupt) ends it with that exception, its `partial` the SweepResult of the rows so far."""
    if runner is None:
        runner = run_distributed_point if sweep.world_size > 1 else run_points
    report = ReportFile(out) if out is not None else None
    environment = environment_record(sweep, command)
    try:
        done = _start_report(report, sweep, resume, environment) if report is not None else {}
        if on_report is not None and report is not None:
            on_report(report)
        result = _measure(_Sweeper(sweep, report, done, on_row, runner, predict, group_runner or run_isolated_group))
        end = end_record()
        if report is not None:
            report.append(end)
        return result.model_copy(update={"environment": {**environment, "load_average_end": end["load_average"]}})
    finally:
        if report is not None:
            report.close()


def _measure(sweeper: _Sweeper) -> SweepResult:
    sweep = sweeper.sweep
    summaries = []
    try:
        if sweep.interleave:
            summaries = _interleaved(sweeper)
        else:
            for impl in sweep.impls:
                for line in sweep.variants(impl):  # block-sparse: one line per target density
                    sweeper.line, first = line, len(sweeper.rows)
                    summary = sweeper.until_oom() if sweep.until_oom else sweeper.fixed()
                    summaries.append(_with_fits(summary, line, sweeper.rows[first:]))
    except (KeyboardInterrupt, Interrupted) as exc:  # the rows so far, each in `out` already, go with it
        exc.partial = SweepResult(rows=sweeper.rows, summaries=summaries)
        raise
    return SweepResult(rows=sweeper.rows, summaries=summaries)


def _with_fits(summary: ImplSummary, line: Problem, rows: list[BenchRow]) -> ImplSummary:
    return summary.model_copy(update={**pattern_fields(line, densities=False), **scaling_exponents(rows)})


def _interleaved(sweeper: _Sweeper) -> list[ImplSummary]:
    """--interleave: at each N the lines not stopped yet are measured together (run_isolated_group); a line
    that fails is skipped at the larger lengths, as in a fixed sweep."""
    sweep = sweeper.sweep
    lines = [line for impl in sweep.impls for line in sweep.variants(impl)]
    rows: list[list[BenchRow]] = [[] for _ in lines]
    for n in sweep.seq_lens:
        todo = []
        for i, line in enumerate(lines):
            problem = line.with_(seq_len=n)
            if (row := sweeper.measured(problem)) is None:
                predicted = sweeper.predict(problem) if sweeper.predict else None
                if (result := sweeper.before_running(predicted, _blocked(rows[i]))) is None:
                    todo.append((i, problem, predicted))
                    continue
                row = sweeper.record(problem, result, predicted)
            rows[i].append(row)
        results = sweeper.group_runner(sweep, [problem for _, problem, _ in todo]) if todo else []
        for (i, problem, predicted), result in zip(todo, results):
            rows[i].append(sweeper.record(problem, sweeper.checked(result), predicted))
    return [_with_fits(_line_summary(line.impl, rows[i]), line, rows[i]) for i, line in enumerate(lines)]
