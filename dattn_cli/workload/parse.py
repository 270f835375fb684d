"""Command-line values into numbers: sequence lengths (4k), sizes (2GiB), comma-separated lists."""

from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_seq_lens(text: str) -> list[int]:
    """'4k,8k,32768' -> [4096, 8192, 32768]; k = 1024, m = 1024**2."""
    values = []
    for part in str(text).split(","):
        part = part.strip().lower()
        match = re.fullmatch(r"(\d+)([km]?)", part)
        if not match:
            raise ValueError(f"--seq-len: {part!r} is not a length; write e.g. 4k,8k,32768")
        value = int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[match.group(2)]
        if value <= 0:
            raise ValueError(f"--seq-len: {part!r} must be positive")
        values.append(value)
    return values


def parse_size(text: str, option: str = "--max-memory") -> int:
    """'2GiB', '512MB', '1.5g' -> bytes."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{option}: {text!r} is not a size; write e.g. 2GiB, 512MiB or 8GB")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"{option}: {text!r} must be positive")
    return value


def parse_int_list(text: str | list[int], option: str) -> list[int]:
    if isinstance(text, list):
        return [int(x) for x in text]
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of integers, e.g. 2048,4096") from None


def parse_float_list(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of numbers, e.g. 0.05,0.1,0.25") from None
