"""Report rows: one per measured point, appended to JSONL the moment it exists."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Literal

from pydantic import BaseModel

FLOP_CONVENTION = (
    "fwd FLOPs = 4*D*P, P = attended (query, key) pairs summed over batch, heads and dilation pairs "
    "(causal counted exactly); fwd+bwd = 3.5 x fwd"
)
KEY_FIELDS = ("impl", "seq_len", "mode", "batch", "heads", "head_dim", "segments", "dilations", "semantics",
              "causal", "dtype", "device", "world_size", "pattern", "target", "embed_dim", "layers", "checkpointing", "amp", "vocab_size")


class BenchRow(BaseModel):
    record: Literal["point"] = "point"
    impl: str
    semantics: str
    dtype: str
    device: str
    batch: int
    heads: int
    head_dim: int
    seq_len: int
    segments: list[int]
    dilations: list[int]
    causal: bool
    mode: str
    world_size: int = 1
    pattern: str | None = None  # block-sparse implementations: the block pattern, e.g. local(window 13, block 128)
    block_density: float | None = None  # active blocks / all blocks
    element_density: float | None = None  # attended (query, key) pairs / N^2 (what the work scales with)
    target: Literal["attention", "layer", "model"] = "attention"
    embed_dim: int | None = None  # layer/model rows: width, depth (1 for a layer), options, parameters
    layers: int | None = None
    vocab_size: int | None = None  # model rows
    checkpointing: bool = False
    amp: str | None = None
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
    error: str | None = None

    def key(self) -> tuple:
        return point_key(self.model_dump())


def point_key(row: dict) -> tuple:
    return tuple(tuple(row.get(f)) if isinstance(row.get(f), list) else row.get(f) for f in KEY_FIELDS)


def append_jsonl(path: Path, record: dict) -> None:
    """Append one line and make it durable before returning (a killed sweep keeps it)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> list[BenchRow]:
    """Point rows of a JSONL report; environment records and a torn last line are skipped."""
    rows = []
    if not Path(path).exists():
        return rows
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a killed writer left half-written
            if data.get("record", "point") == "point":
                try:
                    rows.append(BenchRow.model_validate(data))
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not a dattn bench row ({str(exc).splitlines()[0]})") from None
    return rows


def rows_frame(rows: Iterable[BenchRow]):
    import pandas as pd

    return pd.DataFrame([r.model_dump() for r in rows])
