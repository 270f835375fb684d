"""Each point in an isolated worker (runtime.launch): an OOM, crash or time-out becomes a row instead
of ending the sweep. On CPU the worker caps its own address space (runtime.limits) so an allocation
beyond --max-memory fails inside torch; the parent also watches the worker's RSS and its time budget.
Distributed points run on --world-size ranks of a process group started by the same launcher. What crosses
the process boundary is a PointResult (bench/point.py), validated on both sides.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from ..runtime.attach import backend as attach_backend
from ..runtime.launch import DistributedError, run_distributed, run_isolated as launch_isolated
from ..runtime.limits import RLIMIT_SLACK, cap_memory, is_oom
from ..runtime.measure import rss_bytes
from ..workload.problem import Problem
from ..workload.records import BenchRow, row_fields
from .config import Sweep
from .interleave import measure_group
from .point import TIMING_HEADROOM, PointResult, measure_point, result_fields

OOM_TEXT = ("memoryerror", "out of memory", "can't allocate", "cannot allocate", "code -9")


def _child(conn, sweep_data: dict, problem_data: dict) -> None:
    start_rss = rss_bytes()
    try:
        sweep = _ready(sweep_data)
        result = PointResult.model_validate(measure_point(sweep, Problem.model_validate(problem_data), start_rss))
    except BaseException as exc:  # every failure becomes a row; the sweep goes on
        result = PointResult.model_validate(failure_row(exc))
    conn.send(result)
    conn.close()


def _group_child(conn, sweep_data: dict, problems_data: list[dict]) -> None:
    try:
        sweep = _ready(sweep_data)
        problems = [Problem.model_validate(p) for p in problems_data]
        results = [failure_row(r) if isinstance(r, BaseException) else r for r in measure_group(sweep, problems)]
        results = [PointResult.model_validate(r) for r in results]
    except BaseException as exc:  # every line gets the failure
        results = [PointResult.model_validate(failure_row(exc))] * len(problems_data)
    conn.send(results)
    conn.close()


def _set_threads(sweep: Sweep) -> None:
    import torch

    torch.set_num_threads(sweep.threads)


def _ready(sweep_data: dict) -> Sweep:
    """The worker's sweep, its torch threads set and its address space capped."""
    sweep = Sweep.model_validate(sweep_data)
    _set_threads(sweep)
    cap_memory(sweep.max_memory, sweep.device)
    return sweep


def failure_row(exc: BaseException) -> dict:
    try:
        oom = is_oom(exc)
    except Exception:
        oom = False
    errors = exc.errors() if hasattr(exc, "errors") and callable(exc.errors) else None  # pydantic: its first message
    text = str(errors[0].get("msg", "")) if errors else str(exc)
    message = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
    if not oom and os.environ.get("DATTN_DEBUG"):
        traceback.print_exc()
    return _failed(oom, message, "exception in worker")


def _failed(oom: bool, error: str, reason: str) -> dict:
    """A failure row's fields: oom (its reason "out of memory") or error (`reason`)."""
    return {"status": "oom" if oom else "error", "error": error, "reason": "out of memory" if oom else reason}


def run_isolated(sweep: Sweep, problem: Problem, child: Callable = _child) -> dict:
    """Measure one point in a fresh worker; OOM, crash or time-out become a result, never an exception. The
    worker's PointResult is validated on arrival; the row fields it set are returned."""
    return result_fields(_launch(sweep, child, problem.model_dump(), lines=1, result=PointResult))


def run_isolated_group(sweep: Sweep, problems: list[Problem]) -> list[dict]:
    """--interleave: the problems of one N in one fresh worker (bench.interleave); a crash, OOM kill or time-out
    of the worker becomes every line's row."""
    data = [p.model_dump() for p in problems]
    result = _launch(sweep, _group_child, data, lines=len(problems), result=list[PointResult])
    return [result_fields(r) for r in result] if isinstance(result, list) else [result] * len(problems)


def _launch(sweep: Sweep, child: Callable, problem_data: dict | list[dict], lines: int, result: Any):
    """A fresh worker running child(conn, sweep, problem_data): --max-seconds per line (plus 30 s to start), and
    on CPU its RSS watched against twice --max-memory."""
    rss_limit = None if sweep.cuda else int(TIMING_HEADROOM * sweep.max_memory + RLIMIT_SLACK)
    per_line = " per interleaved line" if lines > 1 else ""
    return launch_isolated(
        child,
        (sweep.model_dump(), problem_data),
        deadline_s=sweep.max_seconds * lines + 30.0,
        deadline_text=f"--max-seconds {sweep.max_seconds:g}{per_line}",
        rss_limit=rss_limit,
        rss_limit_text=f"{TIMING_HEADROOM}x --max-memory",
        result=result,
    )


def measure_rank(rank: int, world: int, sweep_data: dict, problem_data: dict) -> BaseModel:
    """One rank of a distributed point: memory above this rank's RSS after the process group is up,
    address space capped like a single-process worker."""
    import torch
    import torch.distributed as dist

    sweep, problem = Sweep.model_validate(sweep_data), Problem.model_validate(problem_data)
    _set_threads(sweep)
    if sweep.cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
        sweep, problem = sweep.model_copy(update={"device": device}), problem.model_copy(update={"device": device})
    cap_memory(sweep.max_memory, sweep.device)
    return PointResult.model_validate(measure_point(sweep, problem, rss_bytes(), group=dist.group.WORLD))


def run_distributed_point(sweep: Sweep, problem: Problem) -> dict:
    """Measure one point on problem.world_size ranks; a failing, OOM or stuck rank becomes a row naming the rank."""
    if reason := problem.spec.shard_rule(problem, problem.world_size):
        return {"status": "skipped", "reason": f"cannot shard: {reason}"}
    backend = attach_backend() if sweep.cuda else "gloo"  # CUDA: CPU tensors (the clock's all-reduces) still over gloo
    try:
        per_rank = run_distributed(
            measure_rank,
            problem.world_size,
            sweep.model_dump(),
            problem.model_dump(),
            backend=backend,
            timeout_s=sweep.dist_timeout + sweep.max_seconds,
            result=PointResult,
        )
    except DistributedError as exc:
        text = str(exc)
        return _failed(any(s in text.lower() for s in OOM_TEXT), text[:500], "a rank failed")
    per_rank = [result_fields(r) for r in per_rank]
    bad = [r for r in per_rank if r["status"] != "ok"]
    return bad[0] if bad else _combine_ranks(per_rank)


def _combine_ranks(per_rank: list[dict]) -> dict:
    """The slowest rank's times; the largest peak and bytes moved over ranks (every rank's peak kept); each
    rank's own median time and their max/mean."""
    result = dict(max(per_rank, key=lambda r: r["time_ms"]))
    own = [t for r in per_rank for t in r.get("rank_time_ms") or []]
    if len(own) == len(per_rank):
        result["rank_time_ms"] = own
        result["rank_time_max_over_mean"] = max(own) / (sum(own) / len(own))
    result["peak_mem_bytes_per_rank"] = [r["peak_mem_bytes"] for r in per_rank]
    result["peak_mem_bytes"] = max(result["peak_mem_bytes_per_rank"])
    for way in ("sent", "received"):
        values = [r.get(f"comm_bytes_{way}") for r in per_rank]
        result[f"comm_bytes_{way}"] = max(values) if None not in values else None
    result["mem_method"] = (
        f"{result.get('mem_method') or ''}; per rank, the largest over ranks (all in peak_mem_bytes_per_rank)"
    )
    return result


def make_row(problem: Problem, result: dict, predicted: int | None) -> BenchRow:
    return BenchRow(**row_fields(problem), predicted_mem_bytes=predicted, **result)
