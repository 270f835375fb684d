"""`dattn profile` as a library: pattern-cache and memory-pool effects, caches on vs off (SPEC §4).

`run_profile` runs one registered implementation in two settings, one after the other, each starting
from an empty global pattern cache and memory pool:

* caches_on:  use_pattern_cache=True,  enable_memory_pool=True
* caches_off: use_pattern_cache=False, enable_memory_pool=False

and reports for each the cache and pool statistics, time per iteration and peak memory. Nothing is
estimated: every number is read from the cache, the pool, the clock or the allocator / kernel.
"""

from __future__ import annotations

import gc
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Literal, Sequence

import torch
from pydantic import BaseModel
from torch import nn

from . import __version__
from .runtime.envinfo import cpu_name
from .kernels.block_sparse.patterns import block_sparse_options
from .runtime.measure import quantile, rss_bytes
from .kernels import (
    REGISTRY,
    get_global_memory_pool,
    get_global_pattern_cache,
    reset_global_memory_pool,
    reset_global_pattern_cache,
)
from .kernels.pattern import validate_pattern

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
MODES = ("fwd", "fwdbwd")
TRACE_ITERATIONS = 3
RSS_SAMPLE_INTERVAL_S = 0.002


# report models ----------------------------------------------------------------------------------
class ProfileConfig(BaseModel):
    impl: str
    kind: str
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    embed_dim: int | None
    segment_lengths: list[int]
    dilation_rates: list[int]
    semantics: str
    causal: bool
    dtype: str
    device: str
    mode: str
    iterations: int
    warmup: int
    seed: int
    block_options: dict | None = None  # block-sparse implementations: pattern, block_size, window, density, ...


class BlockPatternStats(BaseModel):
    """The block pattern a block-sparse implementation ran, and what it keeps in the pattern cache."""

    label: str
    description: str
    block_density: float
    element_density: float
    block_table_bytes: int
    executor: str | None  # what ran on the last call (flex or gather) and why
    cached_bytes: int  # pattern-cache bytes after the caches-on run: the table, plus the gather plan or BlockMask


class PatternCacheStats(BaseModel):
    hits: int
    misses: int
    evictions: int
    hit_rate: float
    entries: int
    bytes: int


class MemoryPoolStats(BaseModel):
    requests: int
    reuses: int
    reuse_rate: float
    bytes_held: int
    peak_bytes_held: int


class TimeStats(BaseModel):
    median_ms: float
    p10_ms: float
    p90_ms: float
    samples_ms: list[float]


class CudaAllocatorStats(BaseModel):
    """A summary of `torch.cuda.memory_stats()`; field names are its keys with dots as underscores."""

    allocated_bytes_all_peak: int
    reserved_bytes_all_peak: int
    num_alloc_retries: int
    num_ooms: int


class MemoryStats(BaseModel):
    memory_method: str
    baseline_bytes: int | None
    peak_bytes: int | None
    peak_above_baseline_bytes: int | None
    rss_samples: int
    cuda_allocator: CudaAllocatorStats | None = None


class SettingResult(BaseModel):
    name: Literal["caches_on", "caches_off"]
    use_pattern_cache: bool
    enable_memory_pool: bool
    calls: int
    backend: str | None
    pattern_cache: PatternCacheStats
    memory_pool: MemoryPoolStats
    time: TimeStats
    memory: MemoryStats
    block_pattern: BlockPatternStats | None = None


class ProfileReport(BaseModel):
    config: ProfileConfig
    environment: dict[str, str]
    caches_on: SettingResult
    caches_off: SettingResult
    speedup_on_vs_off: float
    trace_path: str | None
    trace_iterations: int
    notes: list[str]
    block_pattern: BlockPatternStats | None = None


# validation -------------------------------------------------------------------------------------
def _check_positive(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}: pass {name}={minimum} or more")


def _check_inputs(
    impl: str, sizes: dict[str, int], dtype: str, mode: str, device: str, trace: str | Path | None
) -> tuple[torch.dtype, torch.device]:
    if impl not in REGISTRY:
        raise ValueError(f"impl={impl!r} is unknown: use one of {', '.join(REGISTRY)}")
    if REGISTRY[impl].kind not in ("core", "multihead"):
        raise ValueError(f"impl={impl!r} is a {REGISTRY[impl].kind} implementation: profile takes core or multihead ones")
    for name, value in sizes.items():
        _check_positive(name, value, minimum=0 if name == "warmup" else 1)
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown: use one of {', '.join(DTYPES)}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown: use one of {', '.join(MODES)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device: use 'cpu' or 'cuda'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported: use 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here: use device='cpu'")
    if trace is not None and not Path(trace).parent.is_dir():
        raise ValueError(f"trace={str(trace)!r}: directory {str(Path(trace).parent)!r} does not exist; create it first")
    return DTYPES[dtype], dev


# running one setting ----------------------------------------------------------------------------
def build_module(cfg: ProfileConfig, caches: bool, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """The module a profile runs, caches on or off (block-sparse: with cfg.block_options)."""
    impl = REGISTRY[cfg.impl]
    switches = {"use_pattern_cache": caches, "enable_memory_pool": caches, "semantics": cfg.semantics}
    options = {"segment_lengths": cfg.segment_lengths, "dilation_rates": cfg.dilation_rates}
    if impl.block_sparse:
        given = dict(cfg.block_options or {})
        options = block_sparse_options(given.pop("pattern", "dilated"), cfg.segment_lengths, cfg.dilation_rates,
                                       switches.pop("semantics"), **given)
    if impl.kind == "multihead":
        return impl.cls(cfg.embed_dim, cfg.heads, device=device, dtype=dtype, **options, **switches)
    segs, rates = options.pop("segment_lengths", None), options.pop("dilation_rates", None)
    return impl.cls(segs, rates, **options, **switches)


def block_table_for(cfg: ProfileConfig) -> torch.Tensor:
    """The block table (query block x key block, True = attend) of a block-sparse profile configuration."""
    module = build_module(cfg, caches=False)
    core = module.attention if REGISTRY[cfg.impl].kind == "multihead" else module
    return core.block_table(cfg.seq_len, cfg.heads)


class _Workload:
    """One module plus its inputs, built from the seed so every setting sees the same numbers."""

    def __init__(self, cfg: ProfileConfig, dtype: torch.dtype, device: torch.device, caches: bool):
        impl = REGISTRY[cfg.impl]
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda_devices):  # seed locally; the caller's RNG state is kept
            torch.manual_seed(cfg.seed)
            self.module: nn.Module = build_module(cfg, caches, device, dtype)
            if impl.kind == "multihead":
                shape = (cfg.batch, cfg.seq_len, cfg.embed_dim)
                x = self._randn(shape, dtype, device, cfg.mode)
                self.inputs: tuple[torch.Tensor, ...] = (x, x, x)  # self-attention: the fused projection path
            else:
                shape = (cfg.batch, cfg.seq_len, cfg.heads, cfg.head_dim)
                self.inputs = tuple(self._randn(shape, dtype, device, cfg.mode) for _ in range(3))
            self.grad_out = torch.randn(shape, dtype=dtype, device=device) if cfg.mode == "fwdbwd" else None
        self.multihead = impl.kind == "multihead"
        self.causal = cfg.causal
        self.leaves = [t for t in {id(t): t for t in self.inputs}.values() if t.requires_grad]

    @staticmethod
    def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, mode: str) -> torch.Tensor:
        return torch.randn(shape, dtype=dtype, device=device).requires_grad_(mode == "fwdbwd")

    def step(self) -> None:
        if self.grad_out is None:
            with torch.no_grad():
                self._forward()
            return
        for t in self.leaves:
            t.grad = None
        self.module.zero_grad(set_to_none=True)
        self._forward().backward(self.grad_out)

    def _forward(self) -> torch.Tensor:
        out = self.module(*self.inputs, is_causal=self.causal)
        return out[0] if self.multihead else out

    @property
    def core(self) -> nn.Module:
        return self.module.attention if self.multihead else self.module

    def backend(self) -> str | None:
        core = self.core
        last = getattr(core, "last_backend", None)
        return last[0] if last else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_iterations(step: Callable[[], None], iterations: int, device: torch.device) -> TimeStats:
    samples = []
    for _ in range(iterations):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        samples.append((time.perf_counter() - start) * 1e3)
    ordered = sorted(samples)
    return TimeStats(
        median_ms=quantile(ordered, 0.5), p10_ms=quantile(ordered, 0.1), p90_ms=quantile(ordered, 0.9),
        samples_ms=samples,
    )


# memory measurement -----------------------------------------------------------------------------
CPU_MEMORY_METHOD = (
    f"CPU: resident set size sampled from /proc/self/statm every {RSS_SAMPLE_INTERVAL_S * 1e3:g} ms by a "
    "background thread during warm-up and timed iterations; peak_above_baseline_bytes = peak RSS minus the RSS "
    "just before the setting's first call (the process's own peak RSS cannot be reset). Peaks shorter than "
    "the interval can be missed, and heap pages the allocator kept from an earlier setting are reused "
    "without raising RSS, so a later setting can read lower "
    "(one unmeasured priming call before the first setting keeps one-time library set-up out of both)."
)
CUDA_MEMORY_METHOD = (
    "CUDA: torch.cuda.max_memory_allocated() after torch.cuda.reset_peak_memory_stats() at the start of the "
    "setting; peak_above_baseline_bytes = that peak minus torch.cuda.memory_allocated() at the start; "
    "cuda_allocator summarises torch.cuda.memory_stats() over the setting."
)


class _RssSampler:
    """Peak RSS over a `with` block, sampled by a daemon thread (torch ops release the GIL)."""

    def __init__(self, interval_s: float = RSS_SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dattn-rss-sampler", daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_bytes())
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _measure(run: Callable[[], TimeStats], device: torch.device) -> tuple[TimeStats, MemoryStats]:
    """Run `run` (warm-up + timed iterations) while measuring peak memory the way the device allows."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        times = run()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        stats = torch.cuda.memory_stats(device)
        allocator = CudaAllocatorStats(
            allocated_bytes_all_peak=stats.get("allocated_bytes.all.peak", 0),
            reserved_bytes_all_peak=stats.get("reserved_bytes.all.peak", 0),
            num_alloc_retries=stats.get("num_alloc_retries", 0),
            num_ooms=stats.get("num_ooms", 0),
        )
        memory = MemoryStats(
            memory_method=CUDA_MEMORY_METHOD, baseline_bytes=baseline, peak_bytes=peak,
            peak_above_baseline_bytes=peak - baseline, rss_samples=0, cuda_allocator=allocator,
        )
        return times, memory
    try:
        sampler = _RssSampler()
    except (OSError, ValueError, IndexError):
        unavailable = "CPU: not measured; /proc/self/statm is not readable on this system"
        return run(), MemoryStats(memory_method=unavailable, baseline_bytes=None, peak_bytes=None,
                                  peak_above_baseline_bytes=None, rss_samples=0)
    with sampler:
        times = run()
    memory = MemoryStats(
        memory_method=CPU_MEMORY_METHOD, baseline_bytes=sampler.baseline, peak_bytes=sampler.peak,
        peak_above_baseline_bytes=sampler.peak - sampler.baseline, rss_samples=sampler.samples,
    )
    return times, memory


# settings, trace, report ------------------------------------------------------------------------
def _run_setting(
    cfg: ProfileConfig, dtype: torch.dtype, device: torch.device, caches: bool, trace: Path | None
) -> SettingResult:
    """Reset the global cache and pool, then warm up and time `cfg.iterations` calls.

    The cache and pool statistics cover every call of the setting (warm-up included), so the cold
    first call's misses are part of the hit rate. A trace, if asked for, is taken after the
    statistics and timings are read, so profiler overhead touches neither.
    """
    gc.collect()
    reset_global_pattern_cache()
    reset_global_memory_pool()
    work = _Workload(cfg, dtype, device, caches)

    def run() -> TimeStats:
        for _ in range(cfg.warmup):
            work.step()
        return _time_iterations(work.step, cfg.iterations, device)

    times, memory = _measure(run, device)
    result = SettingResult(
        name="caches_on" if caches else "caches_off",
        use_pattern_cache=caches,
        enable_memory_pool=caches,
        calls=cfg.warmup + cfg.iterations,
        backend=work.backend(),
        pattern_cache=PatternCacheStats(**_pick(get_global_pattern_cache().stats(), PatternCacheStats)),
        memory_pool=MemoryPoolStats(**_pick(get_global_memory_pool().stats(), MemoryPoolStats)),
        time=times,
        memory=memory,
    )
    if hasattr(work.core, "block_table"):
        core = work.core
        n, h = cfg.seq_len, cfg.heads
        executor = core.last_executor
        result.block_pattern = BlockPatternStats(
            label=core.pattern.label(), description=core.pattern.describe(n), block_density=core.density(n, h),
            element_density=core.element_density(n, h, cfg.causal),
            block_table_bytes=core.block_table(n, h).numel(),
            executor=f"{executor[0]} ({executor[1]})" if executor else None,
            cached_bytes=get_global_pattern_cache().stats()["bytes"],
        )
    if trace is not None:
        _write_trace(work.step, device, trace)
    return result


def _prime(cfg: ProfileConfig, dtype: torch.dtype, device: torch.device) -> None:
    """One unmeasured call, caches off, so one-time library set-up is charged to neither setting."""
    _Workload(cfg, dtype, device, caches=False).step()
    _sync(device)


def _pick(stats: dict[str, float], model: type[BaseModel]) -> dict[str, float]:
    return {name: stats[name] for name in model.model_fields}


def _write_trace(step: Callable[[], None], device: torch.device, path: Path) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
        for _ in range(TRACE_ITERATIONS):
            step()
        _sync(device)
    prof.export_chrome_trace(str(path))


def _environment(device: torch.device) -> dict[str, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = cpu_name()
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


def run_profile(
    impl: str = "ImprovedDilatedAttention",
    *,
    batch: int = 1,
    seq_len: int = 8192,
    heads: int = 8,
    head_dim: int = 64,
    segment_lengths: Sequence[int] = (2048, 4096, 8192),
    dilation_rates: Sequence[int] = (1, 2, 4),
    semantics: str = "longnet",
    causal: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
    mode: Literal["fwd", "fwdbwd"] = "fwd",
    iterations: int = 20,
    warmup: int = 2,
    seed: int = 0,
    trace: str | Path | None = None,
    block_options: dict | None = None,
) -> ProfileReport:
    """Run `impl` with caches on, then off, and report cache/pool statistics, time and peak memory.

    `mode="fwd"` runs under `torch.no_grad()`; `"fwdbwd"` back-propagates a random output gradient
    each iteration. `trace` writes a Chrome trace of a few extra caches-on iterations.
    """
    sizes = {"batch": batch, "seq_len": seq_len, "heads": heads, "head_dim": head_dim,
             "iterations": iterations, "warmup": warmup}
    torch_dtype, dev = _check_inputs(impl, sizes, dtype, mode, device, trace)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}: pass seed=0")
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    kind = REGISTRY[impl].kind
    cfg = ProfileConfig(
        impl=impl, kind=kind, batch=batch, seq_len=seq_len, heads=heads, head_dim=head_dim,
        embed_dim=heads * head_dim if kind == "multihead" else None,
        segment_lengths=list(segs), dilation_rates=list(rates), semantics=semantics, causal=bool(causal),
        dtype=dtype, device=str(dev), mode=mode, iterations=iterations, warmup=warmup, seed=seed,
        block_options=block_options if REGISTRY[impl].block_sparse else None,
    )
    if block_options and not REGISTRY[impl].block_sparse:
        raise ValueError(f"pattern options apply to block-sparse implementations only, not {impl}: drop them or use "
                         + ", ".join(n for n, i in REGISTRY.items() if i.block_sparse))
    trace_path = Path(trace) if trace is not None else None
    _prime(cfg, torch_dtype, dev)
    on = _run_setting(cfg, torch_dtype, dev, caches=True, trace=trace_path)
    off = _run_setting(cfg, torch_dtype, dev, caches=False, trace=None)
    return ProfileReport(
        config=cfg,
        environment=_environment(dev),
        caches_on=on,
        caches_off=off,
        speedup_on_vs_off=off.time.median_ms / on.time.median_ms,
        trace_path=str(trace_path) if trace_path is not None else None,
        trace_iterations=TRACE_ITERATIONS if trace_path is not None else 0,
        notes=_notes(on, off),
        block_pattern=on.block_pattern,
    )
