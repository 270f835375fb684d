"""Record schemas that cross package boundaries: the bench row (written by bench, read by plan --check
and --calibrate, the regression gate and plots), its JSONL file, and its link to the Problem it measured.

A row is flat (one column per field, as CSV users expect) and names the pattern fields segments and
dilations; `row_fields` and `row_problem` are the two directions between a row and its Problem."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from .problem import Problem, Target
from .reportfile import read_records

KEY_FIELDS = (
    "impl",
    "seq_len",
    "mode",
    "batch",
    "heads",
    "head_dim",
    "segments",
    "dilations",
    "semantics",
    "causal",
    "dtype",
    "device",
    "world_size",
    "pattern",
    "target",
    "embed_dim",
    "layers",
    "checkpointing",
    "amp",
    "vocab_size",
    "compiled",
    "kv_heads",
    "documents",
    "layout",
    "head_parallel_size",
)
PROBLEM_NAMES = {"segments": "segment_lengths", "dilations": "dilation_rates"}  # a row's names for Problem fields
LAYER_FIELDS = ("embed_dim", "layers", "checkpointing", "amp", "vocab_size")  # set in layer and model rows only
# The measurement settings that change what a point measures: a resumed point must have been measured with the
# same ones (the problem is in KEY_FIELDS; the regression gate compares problems whatever their settings).
SETTINGS = ("repeat", "warmup", "precision", "cache", "max_memory", "max_seconds", "seed", "threads", "processes")


class BenchRow(BaseModel):
    record: Literal["point"] = "point"
    impl: str
    semantics: str
    dtype: str
    device: str
    batch: int
    heads: int
    kv_heads: int | None = None  # GQA/MQA key/value heads; None: as many as heads
    head_dim: int
    seq_len: int
    segments: list[int]
    dilations: list[int]
    causal: bool
    mode: str
    world_size: int = 1
    layout: str = "contiguous"  # which positions each rank holds (kernels/distributed/layout.py)
    head_parallel_size: int | None = None  # the hybrid classes' h (h x ring); None: the default
    pattern: str | None = None  # block-sparse implementations: the block pattern, e.g. local(window 13, block 128)
    block_density: float | None = None  # active blocks / all blocks
    element_density: float | None = None  # attended (query, key) pairs / N^2 (what the work scales with)
    target: Target = "attention"
    embed_dim: int | None = None  # layer/model rows: width, depth (1 for a layer), options, parameters
    layers: int | None = None
    vocab_size: int | None = None  # model rows
    checkpointing: bool = False
    amp: str | None = None
    compiled: bool = False  # measured under torch.compile
    documents: list[int] | None = None  # packed documents' lengths (cu_seqlens)
    params: int | None = None
    status: Literal["ok", "oom", "error", "skipped"]
    reason: str | None = None
    time_ms: float | None = None
    time_ms_p10: float | None = None
    time_ms_p90: float | None = None
    repeats: int = 0
    tokens_per_s: float | None = None
    flops: float | None = None
    tflops: float | None = None
    peak_mem_bytes: int | None = None
    nvml_used_bytes: int | None = None
    mem_method: str | None = None
    predicted_mem_bytes: int | None = None
    peak_mem_bytes_per_rank: list[int] | None = None  # world_size > 1: peak_mem_bytes is their maximum
    comm_bytes_sent: int | None = None  # per rank per call (fwd, or fwd+bwd), the largest over ranks
    comm_bytes_received: int | None = None
    # world_size > 1: each rank's own median call time (ms, rank order; time_ms is the slowest rank's per call):
    # CPU, its process CPU time (every thread; waits for a peer's data left out); CUDA, the wall time from the
    # barrier before the call to its own end (waits counted)
    rank_time_ms: list[float] | None = None
    rank_time_max_over_mean: float | None = None  # max/mean of rank_time_ms: 1.0 when the ranks' work is balanced
    error: str | None = None
    samples_ms: list[float] | None = (
        None  # every timed call after the warm-up, in order (distributed: the slowest rank's)
    )
    noise: float | None = None  # relative IQR of samples_ms: (q75 - q25) / median
    noisy: bool = False  # the samples are too spread to trust the median alone: noisy_reason says why
    noisy_reason: str | None = None
    median_ci_pct: float | None = None  # the 95% CI of the median, +- this percentage of it (6 samples or more)
    process_medians_ms: list[float] | None = None  # --processes > 1: each worker process's median, in order
    processes: int | None = None
    stopped_by: str | None = None  # why sampling stopped: repeat | precision | max-seconds | max-samples | processes
    warmup_calls: int | None = None
    first_call_ms: float | None = None  # the first call (compiles, graph builds): not a sample, not in --max-seconds
    warmup_settled: bool | None = None  # the last 3 warm-up calls within 10% (None: a fixed --warmup)
    other_cpus: float | None = None  # CPUs kept busy by other processes during the timed calls, on average
    contended: bool = False  # they left too few CPUs for this point's threads (noisy_reason says so)
    gpu_before: dict | None = None  # CUDA: clocks, temperature, power and throttle reasons before the point
    gpu_after: dict | None = None
    throttled: bool = False  # CUDA: a clock-limiting throttle reason before or after the point
    interleaved: bool = False  # timed round-robin with the other lines at this N (bench --interleave)
    # the fused kernels the point's blocks ran on, '+'-joined in first-use order (kernels/block_kernels.py names:
    # cudnn, fa2, fa4, flash-attn2, efficient, cpu-flash, math); None: no block kernel (baselines, older reports)
    block_kernel: str | None = None
    # how the dilated engine merged its blocks (kernels/combine.py PATHS: one-pass, accumulating; '+'-joined);
    # None: no engine call, or a report from before it was recorded (when the accumulating path was the only one)
    merge_path: str | None = None
    # measurement settings (None in reports written before they were recorded: read from the environment
    # record the sweep wrote before its rows, see rows_with_settings)
    repeat: int | None = None
    warmup: int | None = None
    precision: float | None = None
    cache: str | None = None
    max_memory: int | None = None
    max_seconds: float | None = None
    seed: int | None = None
    threads: int | None = None

    def key(self) -> tuple:
        return point_key(self.model_dump())


def point_key(row: dict) -> tuple:
    return tuple(tuple(row.get(f)) if isinstance(row.get(f), list) else row.get(f) for f in KEY_FIELDS)


POSITIVE_TIMES = ("time_ms", "time_ms_p10", "time_ms_p90")
NON_NEGATIVE = (
    "tokens_per_s",
    "flops",
    "tflops",
    "peak_mem_bytes",
    "nvml_used_bytes",
    "predicted_mem_bytes",
    "comm_bytes_sent",
    "comm_bytes_received",
    "rank_time_max_over_mean",
    "params",
)
POSITIVE_SIZES = ("batch", "heads", "head_dim", "seq_len", "world_size")


def implausible(row: BenchRow) -> str | None:
    """Why a row read from a file cannot be a measurement (a time of 0, negative or NaN ms; a size of 0...);
    None when it can."""
    for name in (*POSITIVE_TIMES, *NON_NEGATIVE):
        value, time = getattr(row, name), name in POSITIVE_TIMES
        if value is not None and not (math.isfinite(value) and (value > 0 if time else value >= 0)):
            what = "a positive, finite number of milliseconds" if time else "a finite number >= 0"
            return f"{name} must be {what}, got {value!r}"
    for name in POSITIVE_SIZES:
        if getattr(row, name) < 1:
            return f"{name} must be >= 1, got {getattr(row, name)}"
    if not row.segments or len(row.segments) != len(row.dilations) or min(row.segments + row.dilations) < 1:
        return f"segments {row.segments} and dilations {row.dilations} must be as many positive integers"
    return None


def parse_row(where: str, data: dict) -> BenchRow:
    """The bench row of one report line (`where` = FILE:LINE in messages); a ValueError when it is not a row or
    cannot be a measurement."""
    try:
        row = BenchRow.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error.get("loc", ())) or "row"
        raise ValueError(
            f"{where}: not a dattn bench row ({field}: {error.get('msg', '')}; "
            f"{exc.error_count()} error(s)); remove or repair that line"
        ) from None
    if reason := implausible(row):
        raise ValueError(f"{where}: not a measurement: {reason}; remove or repair that line")
    return row


def rows_with_settings(path: Path) -> list[tuple[int, BenchRow]]:
    """(line number, row) for the point rows of a JSONL report, each row's measurement settings filled, where
    it lacks them (older reports), from the environment record before it. Faults are ValueErrors naming
    FILE:LINE (read_records; a row that does not validate or cannot be a measurement)."""
    rows, config = [], {}
    for number, data in read_records(path):
        kind = data.get("record", "point")
        if kind == "environment":
            config = data.get("config") if isinstance(data.get("config"), dict) else {}
        elif kind == "point":
            row = parse_row(f"{path}:{number}", data)
            known = {name: config.get(name) for name in SETTINGS if getattr(row, name) is None and name in config}
            rows.append((number, row.model_copy(update=known) if known else row))
    return rows


def read_rows(path: Path) -> list[BenchRow]:
    """Point rows of a JSONL report; environment records and a torn last line are skipped. A line that is not
    a JSON object, or a row that is not a measurement, is a ValueError naming FILE:LINE."""
    return [row for _, row in rows_with_settings(path)]


def recorded_setting(path: Path, name: str) -> object | None:
    """The value of measurement setting `name` (a SETTINGS key) the report's points were measured with: its
    last row's, else its last environment record's; None when it records none."""
    value = None
    for _number, data in read_records(path):
        if data.get("record", "point") == "environment" and isinstance(data.get("config"), dict):
            value = data["config"].get(name, value)
    for _, row in rows_with_settings(path):
        value = getattr(row, name) if getattr(row, name) is not None else value
    return value


def settings_mismatch(row: BenchRow, settings: dict) -> str | None:
    """The first measurement setting row was measured with that differs from `settings` ('--repeat 1, this
    run --repeat 3'); None when all that are known agree."""
    for name in SETTINGS:
        then, now, option = getattr(row, name), settings.get(name), "--" + name.replace("_", "-")
        if then is not None and now is not None and then != now:
            return f"{option} {then}, this run {option} {now}"
    return None


def rows_frame(rows: Iterable[BenchRow]):
    import pandas as pd

    return pd.DataFrame([r.model_dump() for r in rows])


def row_fields(p: Problem) -> dict:
    """The row fields that describe problem `p` (besides the measurement)."""
    fields = {name: getattr(p, PROBLEM_NAMES.get(name, name)) for name in KEY_FIELDS if name != "pattern"}
    if p.target == "attention":
        fields.update(embed_dim=None, layers=None, vocab_size=None)
    else:
        fields.update(embed_dim=p.width, vocab_size=p.vocab_size if p.target == "model" else None)
    return {**fields, **pattern_fields(p)}


def pattern_fields(p: Problem, densities: bool = True) -> dict:
    """Block-sparse rows: the pattern label (with a forced executor) and, with `densities`, the block and
    element densities at p's N; None for other implementations."""
    if not p.spec.block_sparse:
        return {"pattern": None}
    pattern = p.block_pattern()
    fields: dict = {"pattern": pattern.label() + (f" [{p.executor}]" if p.executor != "auto" else "")}
    if densities:
        table = pattern.table(p.seq_len, p.heads)
        fields.update(
            block_density=table.float().mean().item(),
            element_density=pattern.pairs(p.seq_len, p.heads, p.causal) / p.seq_len**2,
        )
    return fields


def row_problem(row: BenchRow) -> Problem:
    """The Problem a (non-block-sparse) row measured: what plan --check predicts for it."""
    fields = {
        PROBLEM_NAMES.get(name, name): getattr(row, name)
        for name in KEY_FIELDS
        if name not in ("pattern", *LAYER_FIELDS)
    }
    if row.target != "attention":
        fields.update(
            embed_dim=row.embed_dim or row.heads * row.head_dim,
            layers=row.layers or 1,
            vocab_size=row.vocab_size or 50304,
            checkpointing=row.checkpointing,
            amp=row.amp,
        )
    return Problem(**fields)
