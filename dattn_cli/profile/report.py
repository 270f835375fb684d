"""The pydantic models of a profile report: what one run measured, caches on and off."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from .config import ProfileSettings


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
    config: ProfileSettings  # the problem, and iterations / warmup / seed
    environment: dict[str, str]
    caches_on: SettingResult
    caches_off: SettingResult
    speedup_on_vs_off: float
    trace_path: str | None
    trace_iterations: int
    notes: list[str]
    block_pattern: BlockPatternStats | None = None
