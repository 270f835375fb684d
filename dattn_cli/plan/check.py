"""The planner against reality: predicted vs measured for bench rows, and efficiency calibration."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from ..bench.rows import BenchRow, read_rows
from .memory import Shape
from .model import flops_per_device, plan
from .profiles import HardwareProfile


def shape_of(row: BenchRow) -> Shape:
    return Shape(impl=row.impl, seq_len=row.seq_len, batch=row.batch, heads=row.heads, head_dim=row.head_dim,
                 segment_lengths=row.segments, dilation_rates=row.dilations, semantics=row.semantics,
                 causal=row.causal, dtype=row.dtype, mode=row.mode, world_size=row.world_size)


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
        p = plan(shape_of(row), profile, row.world_size)
        predicted_time = p.time.total_s * 1e3 if p.time else None
        measured_mem = row.peak_mem_bytes
        records.append({
            "impl": row.impl, "seq_len": row.seq_len, "mode": row.mode, "world_size": row.world_size,
            "measured_mem_bytes": measured_mem, "predicted_mem_bytes": p.memory.total,
            "mem_error_pct": _pct(p.memory.total, measured_mem),
            "measured_ms": row.time_ms, "predicted_ms": predicted_time,
            "time_error_pct": _pct(predicted_time, row.time_ms),
        })
    return pd.DataFrame(records)


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
    its rows of achieved / peak FLOP/s (single-device rows; communication is not fitted here)."""
    per_impl: dict[str, list[float]] = {}
    for row in rows:
        if row.world_size != 1 or not row.time_ms:
            continue
        shape = shape_of(row)
        peak = profile.peak_flops(shape.dtype)
        if not peak:
            continue
        achieved = flops_per_device(shape) / (row.time_ms / 1e3)
        per_impl.setdefault(f"{row.impl}/{row.mode}", []).append(achieved / peak)
    if not per_impl:
        raise ValueError(f"{source}: no single-device ok rows with a time to calibrate from")
    fitted = {impl: min(1.0, statistics.median(v)) for impl, v in per_impl.items()}
    efficiency = profile.efficiency.model_copy(update={"per_impl": {**profile.efficiency.per_impl, **fitted}})
    return profile.model_copy(update={"efficiency": efficiency, "calibrated_from": source})
