"""The verification case matrix: small named Problems chosen for the awkward corners of docs/semantics.md.

A case fixes the shape and the dilated pattern; each check sets the implementation, semantics, causal
flag, backend and (block-sparse entries) the block pattern on a copy of it. `dattn verify --seq-len ...`
checks the user's own configuration instead: one case named OWN_CASE."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.block_sparse.patterns import USES_SEGMENTS, USES_WINDOW, takes
from ..kernels.registry import REGISTRY
from ..workload.problem import Problem

VERIFY_BLOCK_SIZE = 8  # small blocks, so the quick cases hold several, a ragged last one included


@dataclass(frozen=True)
class Case:
    name: str
    problem: Problem


def _case(
    name: str,
    batch: int,
    seq_len: int,
    heads: int,
    head_dim: int,
    segments: list[int],
    rates: list[int],
    kv_heads: int | None = None,
    documents: list[int] | None = None,
) -> Case:
    return Case(
        name,
        Problem(
            batch=batch,
            seq_len=seq_len,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            segment_lengths=segments,
            dilation_rates=rates,
            documents=documents,
            block_size=VERIFY_BLOCK_SIZE,
        ),
    )


QUICK = [
    _case("ragged N", 2, 50, 4, 8, [16, 32], [1, 2]),
    _case("w > N", 1, 24, 4, 8, [8, 64], [1, 4]),
    _case("w % r != 0, no r=1", 1, 45, 3, 8, [10, 15], [3, 4]),
    _case("H % m != 0, H % r != 0", 2, 40, 5, 8, [8, 16, 32], [1, 2, 3]),
    _case("divisible, batch 3", 3, 64, 4, 16, [16, 32], [1, 2]),
    # shard-aligned for sequence parallelism: at p = 2, w = 8 < N/p, w = 48 = N/p, w = 96 > N/p; at p = 4
    # the 48- and 96-segments span 2 and 4 ranks
    _case("w <, =, > N/p", 2, 96, 5, 8, [8, 48, 96], [1, 2, 5]),
    # at p = 3 (N/p = 32): 64-segments span ranks {0, 1} and leave rank 2 a short one alone; r = 3 does
    # not divide N/p, so ranks keep different numbers of rows
    _case("ragged groups, r ∤ N/p", 1, 96, 3, 8, [16, 64, 96], [1, 3, 2]),
    # GQA: 4 query heads per kv head; at p = 4 head-parallel has more ranks than kv heads (repeats them)
    _case("GQA, 2 kv heads of 8", 2, 96, 8, 8, [8, 48, 96], [1, 2, 3], kv_heads=2),
    # packed documents (cu_seqlens): at p = 2, 3, 4 the 40-token one crosses a shard boundary
    _case("packed documents", 1, 96, 4, 8, [8, 16, 64], [1, 2, 4], kv_heads=2, documents=[7, 30, 1, 40, 18]),
]

FULL = QUICK + [
    _case("r > H", 1, 96, 2, 16, [32, 96], [1, 5]),
    _case("single pair dense", 2, 33, 2, 8, [33], [1]),
    _case("LongNet-like", 1, 509, 8, 32, [64, 128, 256], [1, 2, 4]),
    _case("long ragged", 2, 1000, 6, 64, [128, 512, 2048], [1, 3, 8]),
    _case("MQA, ragged N", 2, 50, 4, 8, [16, 32], [1, 2], kv_heads=1),
    _case("GQA, kv groups across offsets", 1, 96, 6, 8, [24, 96], [1, 4], kv_heads=3),
]


def case_matrix(full: bool = False) -> list[Case]:
    return list(FULL if full else QUICK)


OWN_CASE = "your configuration"
OWN_DEFAULTS = dict(seq_len=4096)  # unset shape options: Problem's defaults, but N 4k (a quick dense reference)
OWN_PATTERNS = USES_SEGMENTS  # block-sparse checks of the user's configuration: the patterns built from it
SLOW_REFERENCE_SCORES = 1 << 25  # B x H x N^2 beyond which a note says each check takes a while on a CPU


def own_cases(seq_lens: list[int] | None = None, **shape) -> list[Case]:
    """The user's own configuration as the one case to check (one per length when several are given);
    `shape`: batch, heads, kv_heads, head_dim, segment_lengths, dilation_rates, documents (None: Problem's
    defaults)."""
    fields = {k: v for k, v in shape.items() if v is not None}
    seq_lens = seq_lens or [OWN_DEFAULTS["seq_len"]]
    named = [(OWN_CASE if len(seq_lens) == 1 else f"{OWN_CASE}, N={n:,}", n) for n in seq_lens]
    return [Case(name, Problem(seq_len=n, **fields)) for name, n in named]


VERIFY_TOKEN_WINDOW = (13, 5)  # sliding_window: uneven, not a multiple of the block, wider than a block before


def block_fields(
    pattern: str, token_window: tuple[int | None, int | None] | None = None, block_size: int = VERIFY_BLOCK_SIZE
) -> dict:
    """Problem fields of a block-sparse check of `pattern`: `block_size`-token blocks; a one-block window, one
    global block and two hierarchical levels for the patterns that take a window; sliding_window's token window."""
    window = 1 if pattern in USES_WINDOW else None
    left, right = (token_window or VERIFY_TOKEN_WINDOW) if takes(pattern, "token_window") else (None, None)
    return dict(
        pattern=pattern,
        block_size=block_size,
        window=window,
        global_blocks=1,
        levels=2,
        window_left=left,
        window_right=right,
    )


def for_impl(
    problem: Problem,
    impl: str,
    pattern: str = "dilated",
    token_window: tuple[int | None, int | None] | None = None,
    block_size: int | None = None,
    **changes,
) -> Problem:
    """`problem` checked on `impl` (block-sparse entries: with the block fields of `pattern`, in blocks of
    `block_size` tokens, default the problem's: 8 on the case matrix, 128 on your configuration)."""
    fields = block_fields(pattern, token_window, block_size or problem.block_size)
    block = fields if REGISTRY[impl].block_sparse else {}
    return problem.with_(impl=impl, **block, **changes)
