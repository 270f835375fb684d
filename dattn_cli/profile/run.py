"""`dattn profile` as a library: pattern-cache and memory-pool effects, caches on vs off.

`run_profile` runs one problem in two settings, one after the other, each starting from an empty global
pattern cache and memory pool:

* caches_on:  use_pattern_cache=True,  enable_memory_pool=True
* caches_off: use_pattern_cache=False, enable_memory_pool=False

and reports for each the cache and pool statistics, time per iteration and peak memory. Nothing is
estimated: every number is read from the cache, the pool, the clock or the allocator / kernel.
"""

from __future__ import annotations

import gc
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel
from torch import nn

from .. import __version__
from ..kernels.cache import get_global_pattern_cache, reset_global_pattern_cache
from ..kernels.pool import get_global_memory_pool, reset_global_memory_pool
from ..kernels.registry import names
from ..runtime.envinfo import cpu_name
from ..runtime.limits import is_oom
from ..workload.build import build_module
from ..workload.problem import Problem
from .config import ProfileSettings, check_memory, check_problem, check_trace
from .memory import measure, sync
from .report import BlockPatternStats, MemoryPoolStats, PatternCacheStats, ProfileReport, SettingResult, TimeStats
from .work import Workload, time_iterations

TRACE_ITERATIONS = 3


def run_profile(
    problem: Problem, *, iterations: int = 20, warmup: int = 2, seed: int = 0, trace: str | Path | None = None
) -> ProfileReport:
    """Run `problem` with caches on, then off, and report cache/pool statistics, time and peak memory.

    Mode fwd runs under `torch.no_grad()`; fwdbwd back-propagates a random output gradient each
    iteration. `trace` writes a Chrome trace of a few extra caches-on iterations.
    """
    settings = ProfileSettings(problem=problem, iterations=iterations, warmup=warmup, seed=seed)
    device = check_problem(problem)
    check_memory(problem, device)
    trace_path = check_trace(trace)
    try:
        _prime(settings, device)
        on = _run_setting(settings, device, caches=True, trace=trace_path)
        off = _run_setting(settings, device, caches=False, trace=None)
    except (RuntimeError, MemoryError) as exc:
        if not is_oom(exc):
            raise
        raise ValueError(
            f"out of memory profiling B={problem.batch} N={problem.seq_len:,} H={problem.heads} "
            f"D={problem.head_dim}: profile a smaller problem ('dattn plan' predicts what fits)"
        ) from None
    return ProfileReport(
        config=settings,
        environment=_environment(device),
        caches_on=on,
        caches_off=off,
        speedup_on_vs_off=off.time.median_ms / on.time.median_ms,
        trace_path=str(trace_path) if trace_path is not None else None,
        trace_iterations=TRACE_ITERATIONS if trace_path is not None else 0,
        notes=_notes(on, off),
        block_pattern=on.block_pattern,
    )


def block_table_for(problem: Problem) -> torch.Tensor:
    """The block table (query block x key block, True = attend) of a block-sparse problem."""
    if not problem.spec.block_sparse:
        raise ValueError(
            f"--show-pattern applies to block-sparse implementations only, not {problem.impl}: use "
            f"--impl {' or '.join(names(lambda s: s.block_sparse))}"
        )
    module = build_module(problem, device="cpu", use_pattern_cache=False, enable_memory_pool=False)
    core = module.attention if problem.spec.kind == "multihead" else module
    return core.block_table(problem.seq_len, problem.heads)


def _workload(settings: ProfileSettings, device: torch.device, caches: bool) -> Workload:
    p = settings.problem
    return Workload(p, settings.seed, getattr(torch, p.dtype), device, caches)


def _prime(settings: ProfileSettings, device: torch.device) -> None:
    """One unmeasured call, caches off, so one-time library set-up is charged to neither setting."""
    _workload(settings, device, caches=False).step()
    sync(device)


def _run_setting(settings: ProfileSettings, device: torch.device, caches: bool, trace: Path | None) -> SettingResult:
    """Reset the global cache and pool, then warm up and time `settings.iterations` calls.

    The cache and pool statistics cover every call of the setting (warm-up included), so the cold
    first call's misses are part of the hit rate. A trace, if asked for, is taken after the
    statistics and timings are read, so profiler overhead touches neither.
    """
    gc.collect()
    reset_global_pattern_cache()
    reset_global_memory_pool()
    work = _workload(settings, device, caches)

    def run() -> TimeStats:
        for _ in range(settings.warmup):
            work.step()
        return time_iterations(work.step, settings.iterations, device)

    times, memory = measure(run, device)
    result = SettingResult(
        name="caches_on" if caches else "caches_off",
        use_pattern_cache=caches,
        enable_memory_pool=caches,
        calls=settings.warmup + settings.iterations,
        backend=work.backend(),
        pattern_cache=PatternCacheStats(**_pick(get_global_pattern_cache().stats(), PatternCacheStats)),
        memory_pool=MemoryPoolStats(**_pick(get_global_memory_pool().stats(), MemoryPoolStats)),
        time=times,
        memory=memory,
    )
    if hasattr(work.core, "block_table"):
        result.block_pattern = _block_pattern_stats(work.core, settings.problem)
    if trace is not None:
        _write_trace(work.step, device, trace)
    return result


def _block_pattern_stats(core: nn.Module, problem: Problem) -> BlockPatternStats:
    n, h = problem.seq_len, problem.heads
    executor = core.last_executor
    return BlockPatternStats(
        label=core.pattern.label(),
        description=core.pattern.describe(n),
        block_density=core.density(n, h),
        element_density=core.element_density(n, h, problem.causal),
        block_table_bytes=core.block_table(n, h).numel(),
        executor=f"{executor[0]} ({executor[1]})" if executor else None,
        cached_bytes=get_global_pattern_cache().stats()["bytes"],
    )


def _pick(stats: dict[str, float], model: type[BaseModel]) -> dict[str, float]:
    return {name: stats[name] for name in model.model_fields}


def _write_trace(step: Callable[[], None], device: torch.device, path: Path) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
        for _ in range(TRACE_ITERATIONS):
            step()
        sync(device)
    prof.export_chrome_trace(str(path))


def _environment(device: torch.device) -> dict[str, str]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {
        "dattn_version": __version__,
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
        "device_name": name,
        "torch_threads": str(torch.get_num_threads()),
    }


def _notes(on: SettingResult, off: SettingResult) -> list[str]:
    notes = []
    if on.memory_pool.requests == 0:
        notes.append(
            "the memory pool was not used with caches on: this implementation/dtype takes no scratch from it "
            "(ImprovedDilatedAttention pools copies of dilated blocks; half dtypes pool fp32 accumulators)"
        )
    if on.pattern_cache.hits == 0:
        notes.append("no pattern-cache hits with caches on: run more than one call (iterations + warmup > 1)")
    if off.pattern_cache.hits + off.pattern_cache.misses or off.memory_pool.requests:
        notes.append("caches_off still touched the cache or pool: the switches did not reach every code path")
    return notes
