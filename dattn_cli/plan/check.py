"""The planner against reality: predicted vs measured for bench rows, and efficiency calibration."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from ..workload.counts import flops_per_device, linear_flops
from ..workload.records import BenchRow, read_rows, row_problem
from .layers import attention_part, matmul_key, recompute_factors
from .profiles import HardwareProfile
from .solve import plan


def ok_rows(path: Path | str) -> list[BenchRow]:
    """The ok rows the planner models (block-sparse patterns have no planner model yet)."""
    rows = [r for r in read_rows(Path(path)) if r.status == "ok" and r.pattern is None]
    if not rows:
        raise ValueError(f"{path}: no ok rows to check against; run `dattn bench ... --out {path}` first")
    return rows


def check_rows(rows: list[BenchRow], profile: HardwareProfile) -> pd.DataFrame:
    """One line per ok row: predicted and measured peak memory and time, errors in percent."""
    records = []
    for row in rows:
        p = plan(row_problem(row), profile, row.world_size)
        predicted_time = p.time.total_s * 1e3 if p.time else None
        measured_mem = row.peak_mem_bytes
        records.append({
            "impl": row.impl, "target": _target_label(row), "seq_len": row.seq_len, "mode": row.mode,
            "world_size": row.world_size,
            "measured_mem_bytes": measured_mem, "predicted_mem_bytes": p.memory.total,
            "mem_error_pct": _pct(p.memory.total, measured_mem),
            "measured_ms": row.time_ms, "predicted_ms": predicted_time,
            "time_error_pct": _pct(predicted_time, row.time_ms),
        })
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
    """Fit attention efficiency per implementation and mode ('impl/fwd', 'impl/fwdbwd'): the median over
    its rows of achieved / peak FLOP/s (single-device rows; communication is not fitted here). Layer and
    model rows fit the linear layers' efficiency per compute dtype and mode ('matmul:bfloat16/fwdbwd'):
    their linear FLOPs over the time left after the attention's predicted time (attention fitted first)."""
    per_impl: dict[str, list[float]] = {}
    for row in rows:
        if row.world_size != 1 or not _timed(row) or row.target != "attention":
            continue
        shape = row_problem(row)
        peak = profile.peak_flops(shape.dtype)
        if not peak:
            continue
        achieved = flops_per_device(shape) / (row.time_ms / 1e3)
        per_impl.setdefault(f"{row.impl}/{row.mode}", []).append(achieved / peak)
    fitted = {impl: min(1.0, statistics.median(v)) for impl, v in per_impl.items()}
    profile = _with_efficiency(profile, fitted, source)
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
    if not per_impl and not per_dtype:
        raise ValueError(f"{source}: no single-device ok rows with a time to calibrate from")
    return _with_efficiency(profile, {k: min(1.0, statistics.median(v)) for k, v in per_dtype.items()}, source)


def _timed(row: BenchRow) -> bool:
    """A usable time: rows read from a report are refused at reading when a time is 0, negative or NaN
    (records.implausible); rows built in memory are left out of the fit here."""
    return row.time_ms is not None and math.isfinite(row.time_ms) and row.time_ms > 0


def _with_efficiency(profile: HardwareProfile, fitted: dict[str, float], source: str) -> HardwareProfile:
    efficiency = profile.efficiency.model_copy(update={"per_impl": {**profile.efficiency.per_impl, **fitted}})
    return profile.model_copy(update={"efficiency": efficiency, "calibrated_from": source})
