"""Measure one point in this process: time, peak memory, FLOP/s and (distributed) bytes moved.

CPU peak memory: the worker tells glibc, before it builds anything, to give every allocation over
64 KiB its own mapping and return it on free (runtime.measure.return_freed_memory); after the warm-up the
peak RSS is reset and one more call runs. Its peak RSS minus the worker's RSS right after start-up is
everything the point holds at its peak (inputs, weights, caches included), free of what glibc would
otherwise keep from earlier calls. Set only after other calls, the setting comes too late: large chunks
already freed into the heap are reused, never returned, and their history added 5-25% of noise. The
timed calls come last, in the steady state of a long-running process (runtime.measure.reuse_freed_memory:
every allocation from the heap, which is never trimmed): a mapping per allocation costs page faults on every
call (bf16 autocast blocks ran 30-45% slower under it; attention at N=4096 2.3x slower, and its time then
varied 40% between processes). Once the memory call has fitted, the timed calls may use up to twice
--max-memory of address space: the heap keeps freed chunks, which the measured peak rightly leaves out.
GPU: torch.cuda.max_memory_allocated after a reset, plus NVML's device-used figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from ..kernels import combine
from ..kernels.block_kernels import kernels_used, reset_kernels_used
from ..kernels.distributed.sharding import padding_mask
from ..kernels.kernel_choice import ensure_probed
from ..kernels.registry import shard_call_options, shard_length
from ..runtime.limits import address_space_capped, cap_address_space
from ..runtime.measure import nvml_used_bytes, quantile, return_freed_memory, reuse_freed_memory, rss_bytes
from ..runtime.point import call_seconds, peak_of_one_call
from ..runtime.timings import median_ci_pct, relative_iqr
from ..workload.build import build_call
from ..workload.counts import total_flops
from ..workload.problem import Problem
from ..workload.records import KEY_FIELDS, SETTINGS, BenchRow
from .config import Sweep
from .probes import Probes
from .sampling import Agree, Clock, alone, take_samples, warm_up

# What a point's measurement returns, across the worker's or rank's process boundary: the BenchRow fields that
# are measured (not the problem's, which row_fields gives, nor the sweep's settings or the planner's prediction),
# typed by BenchRow's own declarations, unknown names refused.
NOT_MEASURED = {"record", "predicted_mem_bytes", "block_density", "element_density", *KEY_FIELDS, *SETTINGS}
PointResult = create_model(
    "PointResult",
    __config__=ConfigDict(extra="forbid"),
    **{
        name: (f.annotation, f) for name, f in BenchRow.model_fields.items() if name not in NOT_MEASURED - {"processes"}
    },
)


def result_fields(result: BaseModel | dict) -> dict:
    """A point's result as the row fields it sets (a PointResult, or a dict such as a launcher's failure)."""
    return result.model_dump(exclude_unset=True) if isinstance(result, BaseModel) else dict(result)


CPU_MEM_METHOD = (
    "peak RSS of one call after the warm-up, freed memory returned to the OS (glibc mmap threshold "
    "64 KiB from worker start-up), above the isolated worker's RSS after start-up, inputs included"
)
CPU_MEM_METHOD_FALLBACK = "peak RSS (ru_maxrss) of the isolated worker above its RSS after start-up, inputs included"
GPU_MEM_METHOD = "torch.cuda.max_memory_allocated after reset_peak_memory_stats (allocator view)"
TIMING_HEADROOM = 2  # x --max-memory for the timed calls on CPU (see the module docstring)


class ColdCache:
    """--cache cold: the last-level cache overwritten before each call from start() on (the warm-up and the
    timed calls). The buffer is made then, after the memory call, so that call does not count it; on CUDA,
    where the peak spans the whole point, `nbytes` is taken off it."""

    def __init__(self, sweep: Sweep):
        self.device = sweep.device if sweep.cache == "cold" else None
        self.flusher = None

    def start(self) -> None:
        if self.device is not None and self.flusher is None:
            from ..runtime.gpustate import CacheFlusher

            self.flusher = CacheFlusher(self.device)

    @property
    def nbytes(self) -> int:
        return self.flusher.nbytes if self.flusher is not None else 0

    def __call__(self) -> None:
        if self.flusher is not None:
            self.flusher.flush()


def _stepper(
    sweep: Sweep, problem: Problem, group: Any, flush: ColdCache
) -> tuple[Callable[[], float], Any, list[float]]:
    """One call of the point on fresh inputs, returning its seconds (distributed: the slowest rank's, the same
    on every rank); the module; and the list each call appends this rank's own seconds to. `flush` runs before
    each call (ColdCache)."""
    import torch

    if sweep.cuda:  # the block-kernel probe (kernels/kernel_choice.py) runs here, before any call of the point
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(problem.amp, problem.dtype)
        ensure_probed(problem.device, dtype, problem.head_dim, problem.backend)
    call = build_call(problem, *_shard(problem, group))

    def run(inputs: tuple) -> None:
        if problem.mode == "fwdbwd":
            if (out := call.run(*inputs)) is not None:  # None: the call took a whole training step itself
                out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                call.run(*inputs)

    def step() -> float:
        inputs = call.make_inputs()  # fresh random inputs for every call, outside the timed region
        flush()
        if group is not None:
            torch.distributed.barrier(group)
        busy = time.process_time()
        seconds = call_seconds(lambda: run(inputs), problem.device if sweep.cuda else "cpu")
        # CPU: this rank's busy time (process CPU seconds, all its threads), which leaves out waits for its peers
        own.append(seconds if sweep.cuda else time.process_time() - busy)
        return seconds if group is None else _slowest(seconds, group)

    own: list[float] = []
    return step, call.module, own


def _shard(problem: Problem, group: Any) -> tuple[int, dict]:
    """This rank's shard length and call options: the sequence padded at the end to the length the
    implementation can split (registry.shard_length), the padding masked (kernels/distributed/sharding.py)."""
    if group is None:
        return problem.seq_len, shard_call_options(problem, None) if problem.documents else {}
    import torch

    rank, world = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    length = shard_length(problem, world)
    if world * length == problem.seq_len:
        return length, shard_call_options(problem, None) if problem.documents else {}
    mask = padding_mask(
        problem.batch, problem.seq_len, rank, length, problem.device, world=world, layout=problem.layout
    )
    return length, shard_call_options(problem, mask, world * length)


def _slowest(seconds: float, group: Any) -> float:
    import torch

    value = torch.tensor([seconds], dtype=torch.float64)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=group)
    return float(value.item())


def _agreement(group: Any) -> Agree:
    """Stop decisions every rank takes together: True on all ranks when True on any."""
    if group is None:
        return alone

    def agree(flag: bool) -> bool:
        return _slowest(1.0 if flag else 0.0, group) > 0.5

    return agree


def _too_slow(sweep: Sweep, first: float, clock: Clock) -> dict | None:
    """A 'skipped' result if the calls still to come would overrun --max-seconds (the first call's time is
    every rank's slowest, so the ranks agree). Adaptive repeats need only one timed call to fit."""
    untimed = 0 if sweep.cuda else 2  # CPU: the memory call and the heap-settling call
    warmup = max(sweep.warmup - 1, 0) if sweep.warmup is not None else 0
    timed = sweep.repeat or 1
    projected = clock.spent() + first * (warmup + timed + untimed)
    if projected <= sweep.max_seconds:
        return None
    calls = f"{timed} timed call{'s' if timed > 1 else ''}" + (
        f" and {untimed + warmup} untimed" if untimed + warmup else ""
    )
    return {
        "status": "skipped",
        "reason": f"time: one call took {first:.2f} s; with {calls} the point would take "
        f"about {projected:.1f} s, over --max-seconds {sweep.max_seconds:g}",
    }


def first_call(sweep: Sweep, step: Callable[[], float]) -> tuple[float, Clock, dict | None]:
    """The point's first call, kept apart (compiles and graph builds: FA4, FlexAttention, cuDNN); the budget's
    clock, which starts after it; a 'skipped' result if the calls to come would overrun --max-seconds, projected
    from a second call when the first alone would (so that one-off work does not skip a point that fits)."""
    first_s = step()
    clock = Clock(sweep.max_seconds)
    skipped = _too_slow(sweep, first_s, clock)
    if skipped and first_s <= sweep.max_seconds:
        skipped = _too_slow(sweep, step(), clock)
    return first_s, clock, skipped and {**skipped, "first_call_ms": first_s * 1e3}


def _cpu_memory(sweep: Sweep, step: Callable[[], float], start_rss: int, returns_memory: bool) -> dict:
    peak, exact = peak_of_one_call(step, start_rss, returns_memory)
    memory = dict(peak_mem_bytes=peak, mem_method=CPU_MEM_METHOD if exact else CPU_MEM_METHOD_FALLBACK)
    if returns_memory and reuse_freed_memory():
        if address_space_capped():  # capped by the worker (not when measuring in a caller's process)
            cap_address_space(sweep.max_memory, TIMING_HEADROOM)
        step()  # untimed: the heap grows to its steady state under the timing setting
    return memory


def measure_point(sweep: Sweep, problem: Problem, start_rss: int | None = None, group: Any = None) -> dict:
    """Run one point in this process; returns the row fields it measured. With `group` (a rank of an
    initialised process group) this process holds its shard of N and every timed call starts after a barrier."""
    import torch

    start_rss = rss_bytes() if start_rss is None else start_rss
    returns_memory = not sweep.cuda and return_freed_memory()  # before the first allocation (module docstring)
    torch.manual_seed(sweep.seed)
    cold = ColdCache(sweep)
    reset_kernels_used()
    combine.reset_paths()
    step, module, own = _stepper(sweep, problem, group, cold)
    if sweep.cuda:
        torch.cuda.reset_peak_memory_stats()
    probes = Probes(sweep, group)
    first_s, clock, skipped = first_call(sweep, step)
    if skipped:
        return skipped
    memory = {} if sweep.cuda else _cpu_memory(sweep, step, start_rss, returns_memory)
    agree = _agreement(group)
    cold.start()
    probes.start()
    warmup_calls, warm = warm_up([step], sweep.warmup, clock, agree)
    calls_before = module.comm_stats() if hasattr(module, "comm_stats") else None
    own.clear()
    (times,), stopped_by = take_samples([step], sweep.repeat, sweep.precision, clock, agree)
    result = {
        **timing_fields(problem, times, sweep, stopped_by, probes.fields()),
        "warmup_calls": warmup_calls,
        "warmup_settled": warm,
        "first_call_ms": first_s * 1e3,
        "block_kernel": kernels_used(),
        "merge_path": combine.paths_used(),
    }
    if problem.target != "attention":
        result["params"] = sum(p.numel() for p in module.parameters())
    if calls_before is not None:
        result.update(_bytes_moved(calls_before, module.comm_stats(), len(times)))
    if group is not None:  # the worker joins the ranks' lists (bench/worker.py)
        result["rank_time_ms"] = [statistics.median(own) * 1e3]
    if sweep.cuda:
        memory = dict(
            peak_mem_bytes=torch.cuda.max_memory_allocated() - cold.nbytes,
            mem_method=GPU_MEM_METHOD,
            nvml_used_bytes=nvml_used_bytes(torch.cuda.current_device()),
        )
    return {**result, **memory}


def timing_fields(problem: Problem, times: list[float], sweep: Sweep, stopped_by: str, probed: dict) -> dict:
    """Summary fields of the timed calls (`times` in call order, seconds), the samples themselves, and the
    noisy flag with every reason found (spread, precision not reached, contention, throttling)."""
    summary = summary_fields(problem, times)
    ci_pct = summary["median_ci_pct"]
    reasons = [noise_reason(summary["noise"]), probed.pop("contention", None), probed.pop("throttle", None)]
    if stopped_by in ("max-seconds", "max-samples"):
        reached = f"+-{ci_pct:.1f}%" if ci_pct is not None else "no 95% CI (fewer than 6 samples)"
        reasons.append(
            f"stopped by {stopped_by} after {len(times)} samples with the median known to {reached}, "
            f"not --precision {sweep.precision:g}%"
        )
    reasons = [r for r in reasons if r]
    return {
        "status": "ok",
        **summary,
        "stopped_by": stopped_by,
        **probed,
        "noisy": bool(reasons),
        "noisy_reason": "; ".join(reasons) or None,
    }


def summary_fields(problem: Problem, times: list[float]) -> dict:
    """Median, quantiles, rates, the samples (ms), their noise and the CI of their median, from `times` (s)."""
    ordered = sorted(times)
    median = statistics.median(ordered)
    flops = total_flops(problem)
    return {
        "time_ms": median * 1e3,
        "repeats": len(times),
        "time_ms_p10": quantile(ordered, 0.1) * 1e3,
        "time_ms_p90": quantile(ordered, 0.9) * 1e3,
        "tokens_per_s": problem.batch * problem.seq_len / median,
        "flops": flops,
        "tflops": flops / median / 1e12,
        "samples_ms": [t * 1e3 for t in times],
        "noise": noise(ordered),
        "median_ci_pct": median_ci_pct(times),
    }


NOISY_IQR = 0.10  # relative IQR above which a point's median alone is not trusted
MIN_NOISE_SAMPLES = 4  # fewer samples have no meaningful quartiles


def noise(ordered: list[float]) -> float | None:
    """The relative IQR of the samples; None below MIN_NOISE_SAMPLES."""
    return relative_iqr(ordered) if len(ordered) >= MIN_NOISE_SAMPLES else None


def noise_reason(spread: float | None) -> str | None:
    """Why a point whose relative IQR is `spread` is noisy; None when it is not."""
    if spread is None or spread <= NOISY_IQR:
        return None
    return f"relative IQR {spread:.0%} of the median, over {NOISY_IQR:.0%}: other load or unsettled timings"


def _bytes_moved(before: dict, after: dict, calls: int) -> dict:
    moved = {}
    for way in ("sent", "received"):
        total = sum(after[f"{phase}_bytes_{way}"] - before[f"{phase}_bytes_{way}"] for phase in ("forward", "backward"))
        moved[f"comm_bytes_{way}"] = total // calls
    return moved
