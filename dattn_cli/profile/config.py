"""What one profile run is: a Problem plus its measurement settings, and the checks only profile makes.

The Problem has already refused what it can (implementation, sizes, dtype, mode, pattern options);
here: the settings' ranges, where the trace goes, and whether the problem runs in this process.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, field_validator

from ..kernels.registry import names
from ..workload.parse import MAX_CALLS, MAX_SEED, check_count
from ..workload.problem import Problem

# field: (lowest, highest, the fix said below the lowest)
COUNTS = {
    "iterations": (1, MAX_CALLS, "pass --iterations 1 or more"),
    "warmup": (0, MAX_CALLS, "pass --warmup 0 for no warm-up calls"),
    "seed": (0, MAX_SEED, ""),
}


class ProfileSettings(BaseModel):
    """One profile run: the problem, and how many calls are warmed up and timed from which seed."""

    problem: Problem
    iterations: int = 20
    warmup: int = 2
    seed: int = 0

    @field_validator(*COUNTS)
    @classmethod
    def _count(cls, value: int, info) -> int:
        low, high, fix = COUNTS[info.field_name]
        if value < low and fix:
            raise ValueError(f"--{info.field_name} must be >= {low}, got {value}: {fix}")
        return check_count(f"--{info.field_name}", value, low, high)


def check_problem(problem: Problem) -> torch.device:
    """The device the problem runs on in this process; ValueError where profile cannot run it."""
    if problem.target != "attention":
        raise ValueError(f"--target {problem.target}: profile runs the attention call alone; use --target attention")
    if problem.spec.baseline:
        profilable = names(lambda s: not s.baseline and s.single_device)
        raise ValueError(
            f"--impl {problem.impl} is a baseline, with no pattern cache or memory pool to profile: use "
            f"one of {', '.join(profilable)}"
        )
    if problem.world_size > 1:
        raise ValueError(f"--world-size {problem.world_size}: profile runs in one process; use --world-size 1")
    try:
        device = torch.device(problem.device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {problem.device!r} is not a torch device: use --device cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {problem.device!r} is not supported: use --device cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {problem.device!r} but CUDA is not available here: use --device cpu")
    if reason := problem.spec.unavailable(device.type):
        raise ValueError(f"--impl {problem.impl} on --device {device.type}: {reason}")
    return device


def check_memory(problem: Problem, device: torch.device) -> None:
    """Refuse (one line) a CPU problem whose tensors cannot fit in the memory available now: profile runs in
    this process, so an allocation failure would end it halfway. About 12 B x N x H x D tensors: q, k, v, the
    output and their gradients, and the memory pool's gathered copies."""
    from ..runtime.limits import available_memory_bytes

    available = available_memory_bytes()
    p = problem
    need = 12 * p.batch * p.seq_len * p.heads * p.head_dim * p.element_bytes
    if device.type == "cpu" and available is not None and need > available:
        raise ValueError(
            f"--seq-len/--batch/--heads/--head-dim: B={p.batch} N={p.seq_len:,} H={p.heads} D={p.head_dim} "
            f"needs about {need / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB available "
            "here: profile a smaller problem ('dattn plan' predicts what fits)"
        )


def check_trace(trace: str | Path | None) -> Path | None:
    if trace is None:
        return None
    path = Path(trace)
    if str(trace).strip() in ("", ".") or path.is_dir():  # the profiler would fail to write it and say nothing
        raise ValueError(f"--trace {str(trace)!r} is a directory: give a file name, e.g. --trace trace.json")
    if not path.parent.is_dir():
        raise ValueError(f"--trace {str(trace)!r}: directory {str(path.parent)!r} does not exist; create it first")
    return path
