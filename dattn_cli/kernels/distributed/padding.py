"""The padded length of a sequence over p ranks: the smallest N' = p·L whose shards (or zigzag chunks) align with
the segments and blocks (sharding.py tells why padding at the end is exact)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .layout import chunk_count


def _positive(name: str, value, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}: {fix}")
    return value


def _check_lengths(segment_lengths: Sequence[int] | None, block_size: int | None) -> tuple[tuple[int, ...], int]:
    segments = tuple(segment_lengths or ())
    for w in segments:
        _positive("segment_lengths", w, "pass the module's segment lengths, e.g. [2048, 4096]")
    step = 1 if block_size is None else _positive("block_size", block_size, "pass the module's block_size, e.g. 128")
    return segments, step


def _fits(length: int, chunks: int, segments: tuple[int, ...], step: int, whole_groups: bool) -> bool:
    """Chunks of `length` align with every segment (ŵ divides the chunk or is a multiple of it) and with blocks;
    whole_groups (zigzag): a segment spanning chunks also divides the padded sequence, so no group is ragged."""
    if length % step:
        return False
    total = chunks * length
    spans = (min(w, total) for w in segments)
    return all(length % s == 0 or (s % length == 0 and (not whole_groups or total % s == 0)) for s in spans)


def _divisors(n: int) -> set[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return set(small) | {n // d for d in small}


def padded_length(
    seq_len: int,
    world: int,
    segment_lengths: Sequence[int] | None = None,
    block_size: int | None = None,
    layout: str = "contiguous",
) -> int:
    """N' = world·L: the smallest L >= ceil(seq_len/world) whose chunks (layout.py: L, or L/2 under zigzag)
    align with every segment length and with block_size (each optional). One rank takes any N unpadded.

    A chunk length C either divides some mid-length segment (C < ŵ < N'), or no segment is of mid length and
    C is the smallest multiple of lcm(block_size, the segments <= C) above the target: those candidates hold
    the optimum (no search over every integer, which a large lcm would make endless)."""
    _positive("seq_len", seq_len, "pass the sequence length before padding")
    _positive("world", world, "pass the number of ranks")
    segments, step = _check_lengths(segment_lengths, block_size)
    if world == 1:
        return seq_len
    chunks = chunk_count(world, layout)
    target = -(-seq_len // chunks)
    ordered = sorted(set(segments))
    candidates = set()
    for k in range(len(ordered) + 1):  # segments <= C: the k shortest
        multiple = math.lcm(step, *ordered[:k])
        low = max(target, ordered[k - 1] if k else 1)
        candidates.add(-(-low // multiple) * multiple)
    for w in ordered:
        candidates.update(d for d in _divisors(w) if d >= target)
    zigzag = layout == "zigzag"
    return chunks * min(length for length in candidates if _fits(length, chunks, segments, step, zigzag))
