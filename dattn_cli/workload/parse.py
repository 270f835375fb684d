"""Command-line values into numbers: sequence lengths (4k), sizes (2GiB), comma-separated lists; and `clip`,
which cuts user text echoed in a message to ECHO_LIMIT characters."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{prefix + unit: 1000**i for i, prefix in enumerate("kmgt", 1) for unit in ("", "b")},  # k, kb: 10**3 ...
    **{prefix + "ib": 1024**i for i, prefix in enumerate("kmgt", 1)},  # kib: 2**10 ...
}
ECHO_LIMIT = 200  # characters of user input a message repeats
MAX_SIZE_BYTES = 2**60  # 1 EiB: far above any memory, far below a float's overflow
MAX_SEQ_LEN = 2**40  # the longest sequence a Problem takes (workload/problem.py: SIZE_LIMITS)


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """`value` as text, cut to `limit` characters with '...' (a message never repeats a whole huge input)."""
    try:
        text = str(value)
    except ValueError:  # an int past Python's 4,300-digit conversion limit
        text = f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """repr(value) cut to `limit` characters: how a message quotes what the user wrote."""
    return clip(repr(value) if isinstance(value, str) else value, limit)


def parse_seq_lens(text: str) -> list[int]:
    """'4k,8k,32768' -> [4096, 8192, 32768]; k = 1024, m = 1024**2."""
    values = []
    for part in str(text).split(","):
        part = part.strip().lower()
        match = re.fullmatch(r"(\d+)([km]?)", part)
        if not match:
            raise ValueError(f"--seq-len: {shown(part)} is not a length; write e.g. 4k,8k,32768")
        digits = match.group(1).lstrip("0") or "0"
        value = int(digits) * {"": 1, "k": 1024, "m": 1024**2}[match.group(2)] if len(digits) <= 20 else MAX_SEQ_LEN + 1
        if value <= 0:
            raise ValueError(f"--seq-len: {shown(part)} must be positive")
        if value > MAX_SEQ_LEN:
            raise ValueError(f"--seq-len: {shown(part)} is more than dattn handles (2**40 = {MAX_SEQ_LEN:,} tokens)")
        values.append(value)
    return values


def parse_seq_len(text: str) -> int:
    """One length, '8k' -> 8192 (commands that take one N: plan, profile)."""
    values = parse_seq_lens(text)
    if len(values) != 1:
        raise ValueError(f"--seq-len: {shown(text)} is {len(values)} lengths; this command takes one, e.g. 8k")
    return values[0]


def parse_size(text: str, option: str = "--max-memory") -> int:
    """'2GiB', '512MB', '1.5g' -> bytes, at least 1 and at most MAX_SIZE_BYTES (1 EiB)."""
    match = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{option}: {shown(text)} is not a size; write e.g. 2GiB, 512MiB or 8GB")
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not 1 <= value <= MAX_SIZE_BYTES:
        raise ValueError(f"{option}: {shown(text)} must be between 1 byte and 1 EiB (2**60 bytes); write e.g. 2GiB")
    return int(value)


def parse_int_list(text: str | list[int], option: str) -> list[int]:
    if isinstance(text, (list, tuple)):  # a --config YAML list
        if all(isinstance(x, int) and not isinstance(x, bool) for x in text):
            return list(text)
        text = ",".join(map(str, text))
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: {shown(text)} is not a comma-separated list of integers, e.g. 2048,4096") from None


def parse_float_list(text: str, option: str) -> list[float]:
    """Finite numbers only: 'nan', 'inf' and '1e999' are refused here, naming the option."""
    try:
        values = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = [math.nan]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{option}: {shown(text)} is not a comma-separated list of finite numbers, e.g. 0.05,0.1,0.25")
    return values


MAX_SECONDS = 1e6  # --max-seconds, --dist-timeout: 11 days, yet finite (a deadline must be one)
MAX_CALLS = 10**6  # --repeat, --warmup, --iterations
MAX_THREADS = 4096  # --threads: beyond any machine torch runs on
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit seed


def check_number(option: str, value: float, low: float, high: float, *, low_open: bool = False) -> float:
    """`value` if it is a finite number in [low, high] ((low, high] with `low_open`); else ValueError naming
    `option`, the range and the value (NaN, inf and booleans are refused)."""
    interval = f"{'(' if low_open else '['}{_plain(low)}, {_plain(high)}]"
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok or value < low or (low_open and value == low) or value > high:
        raise ValueError(f"{option} must be a finite number in {interval}, got {clip(value)}")
    return value


def check_count(option: str, value: int, low: int, high: int) -> int:
    """`value` if it is an integer in [low, high]; else ValueError naming `option` and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{option} must be an integer from {low:,} to {high:,}, got {clip(value)}")
    return value


def _plain(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"
