"""The planner against reality: predicted vs measured for bench rows, and efficiency calibration."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from ..kernels import combine
from ..workload.counts import flops_per_device, linear_flops
from ..workload.records import BenchRow, read_rows, row_problem
from .efficiency import has_curve
from .layers import attention_part, matmul_key, recompute_factors
from .profiles import HardwareProfile
from .solve import plan
from .time import estimate_time, kernel_for


def ok_rows(path: Path | str) -> list[BenchRow]:
    """The ok rows the planner models (block-sparse patterns have no planner model yet)."""
    rows = [r for r in read_rows(Path(path)) if r.status == "ok" and r.pattern is None]
    if not rows:
        raise ValueError(f"{path}: no ok rows to check against; run `dattn bench ... --out {path}` first")
    return rows


def check_rows(rows: list[BenchRow], profile: HardwareProfile) -> pd.DataFrame:
    """One line per ok row: predicted and measured peak memory and time, errors in percent. A CUDA row's memory
    is torch.cuda.max_memory_allocated(), which holds no CUDA context: its prediction is compared without the
    profile's framework item. Each row is modelled on the merge path its engine took (`merge_path`; rows without
    one are from before the one-pass combine)."""
    records = []
    for row in rows:
        with combine.assume("one-pass" if row.merge_path == "one-pass" else "accumulating"):
            p = plan(row_problem(row), profile, row.world_size)
        predicted_time = p.time.total_s * 1e3 if p.time else None
        measured_mem = row.peak_mem_bytes
        predicted_mem = p.memory.total - (p.memory.items.get("framework", 0) if row.device == "cuda" else 0)
        records.append(
            {
                "impl": row.impl,
                "target": _target_label(row),
                "seq_len": row.seq_len,
                "mode": row.mode,
                "world_size": row.world_size,
                "measured_mem_bytes": measured_mem,
                "predicted_mem_bytes": predicted_mem,
                "mem_error_pct": _pct(predicted_mem, measured_mem),
                "measured_ms": row.time_ms,
                "predicted_ms": predicted_time,
                "time_error_pct": _pct(predicted_time, row.time_ms),
            }
        )
    return pd.DataFrame(records)


def _target_label(row: BenchRow) -> str:
    if row.target == "attention":
        return "attention"
    options = [o for o in ("checkpointing" if row.checkpointing else "", row.amp or "") if o]
    depth = f" x{row.layers}" if row.target == "model" else ""
    return f"{row.target}{depth}" + (f" ({', '.join(options)})" if options else "")


def _pct(predicted, measured) -> float | None:
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def summary(frame: pd.DataFrame) -> dict[str, float | None]:
    out = {}
    for col in ("mem_error_pct", "time_error_pct"):
        values = [abs(v) for v in frame[col] if v is not None and v == v]
        out[f"{col}_median_abs"] = statistics.median(values) if values else None
        out[f"{col}_max_abs"] = max(values) if values else None
    return out


def calibrate(rows: list[BenchRow], profile: HardwareProfile, source: str) -> HardwareProfile:
    """Fit the attention's efficiency, then the linear layers'. GPU rows (device cuda) whose kernel has an
    efficiency curve on the profile (plan/efficiency.py) fit a scale on that curve per kernel and mode
    ('flash/fwdbwd'): the median over the rows of curve-predicted compute time / measured time less the
    predicted gather/merge time, so rows at many N calibrate the curve's level and keep its shape. Other
    single-device attention rows (CPU, kernels without a curve) fit the efficiency per implementation and mode
    ('impl/fwd'): the median of achieved / peak FLOP/s (communication is not fitted here). Layer and model rows
    fit the linear layers' efficiency per compute dtype and mode ('matmul:bfloat16/fwdbwd'): their linear FLOPs
    over the time left after the attention's predicted time (attention fitted first)."""
    scales: dict[str, list[float]] = {}
    per_impl: dict[str, list[float]] = {}
    for row in rows:
        if row.world_size != 1 or not _timed(row) or row.target != "attention":
            continue
        shape = row_problem(row)
        peak = profile.peak_flops(shape.dtype)
        if not peak:
            continue
        seconds = row.time_ms / 1e3
        kernel = kernel_for(shape, profile)
        if shape.device.startswith("cuda") and has_curve(
            profile.efficiency, kernel, shape.dtype, shape.causal, shape.mode
        ):
            if (scale := _curve_scale(shape, profile, kernel, seconds)) is not None:
                scales.setdefault(f"{kernel}/{shape.mode}", []).append(scale)
            continue
        per_impl.setdefault(f"{row.impl}/{row.mode}", []).append(flops_per_device(shape) / seconds / peak)
    profile = _fitted(profile, "kernel_scale", {k: min(10.0, statistics.median(v)) for k, v in scales.items()})
    per_impl = {impl: min(1.0, statistics.median(v)) for impl, v in per_impl.items()}
    profile = _fitted(profile, "per_impl", per_impl, calibrated_from=source)
    per_dtype = _linear_efficiencies(rows, profile)
    if not per_impl and not per_dtype and not scales:
        raise ValueError(f"{source}: no single-device ok rows with a time to calibrate from")
    return _fitted(profile, "per_impl", {k: min(1.0, statistics.median(v)) for k, v in per_dtype.items()})


def _curve_scale(shape, profile: HardwareProfile, kernel: str, seconds: float) -> float | None:
    """Measured / curve-predicted efficiency of one row (the curve unscaled): predicted compute time over the
    measured time less the predicted gather/merge time; None when that leaves no time."""
    scale = {k: v for k, v in profile.efficiency.kernel_scale.items() if k not in (kernel, f"{kernel}/{shape.mode}")}
    unscaled = profile.model_copy(update={"efficiency": profile.efficiency.model_copy(update={"kernel_scale": scale})})
    predicted = estimate_time(shape, unscaled)
    left = seconds - predicted.memory_s
    return predicted.compute_s / left if left > 0 else None


def _linear_efficiencies(rows: list[BenchRow], profile: HardwareProfile) -> dict[str, list[float]]:
    per_dtype: dict[str, list[float]] = {}
    for row in rows:
        if row.target == "attention" or not _timed(row):
            continue
        shape = row_problem(row)
        _, attention_s = attention_part(shape, profile)
        linear_s = row.time_ms / 1e3 - attention_s
        peak = profile.peak_flops(shape.compute_dtype)
        if linear_s > 0 and peak:
            executed = linear_flops(shape) * recompute_factors(shape)[1]
            per_dtype.setdefault(f"{matmul_key(shape)}/{row.mode}", []).append(executed / linear_s / peak)
    return per_dtype


def _fitted(profile: HardwareProfile, field: str, fitted: dict[str, float], **update) -> HardwareProfile:
    """`profile` with `fitted` entries added to its efficiency's `field` (per_impl, kernel_scale)."""
    efficiency = profile.efficiency.model_copy(update={field: {**getattr(profile.efficiency, field), **fitted}})
    return profile.model_copy(update={"efficiency": efficiency, **update})


def _timed(row: BenchRow) -> bool:
    """A usable time: rows read from a report are refused at reading when a time is 0, negative or NaN
    (records.implausible); rows built in memory are left out of the fit here."""
    return row.time_ms is not None and math.isfinite(row.time_ms) and row.time_ms > 0
