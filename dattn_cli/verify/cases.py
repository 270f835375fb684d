"""The verification case matrix: small shapes chosen for the awkward corners of SPEC §2."""

from __future__ import annotations

from pydantic import BaseModel


class VerifyCase(BaseModel):
    name: str
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    segment_lengths: list[int]
    dilation_rates: list[int]


QUICK = [
    VerifyCase(name="ragged N", batch=2, seq_len=50, heads=4, head_dim=8, segment_lengths=[16, 32], dilation_rates=[1, 2]),
    VerifyCase(name="w > N", batch=1, seq_len=24, heads=4, head_dim=8, segment_lengths=[8, 64], dilation_rates=[1, 4]),
    VerifyCase(name="w % r != 0, no r=1", batch=1, seq_len=45, heads=3, head_dim=8, segment_lengths=[10, 15], dilation_rates=[3, 4]),
    VerifyCase(name="H % m != 0, H % r != 0", batch=2, seq_len=40, heads=5, head_dim=8, segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 3]),
    VerifyCase(name="divisible, batch 3", batch=3, seq_len=64, heads=4, head_dim=16, segment_lengths=[16, 32], dilation_rates=[1, 2]),
    # shard-aligned for sequence parallelism: at p = 2, w = 8 < N/p, w = 48 = N/p, w = 96 > N/p; at p = 4
    # the 48- and 96-segments span 2 and 4 ranks
    VerifyCase(name="w <, =, > N/p", batch=2, seq_len=96, heads=5, head_dim=8, segment_lengths=[8, 48, 96], dilation_rates=[1, 2, 5]),
    # at p = 3 (N/p = 32): 64-segments span ranks {0, 1} and leave rank 2 a short one alone; r = 3 does
    # not divide N/p, so ranks keep different numbers of rows
    VerifyCase(name="ragged groups, r ∤ N/p", batch=1, seq_len=96, heads=3, head_dim=8, segment_lengths=[16, 64, 96], dilation_rates=[1, 3, 2]),
]

FULL = QUICK + [
    VerifyCase(name="r > H", batch=1, seq_len=96, heads=2, head_dim=16, segment_lengths=[32, 96], dilation_rates=[1, 5]),
    VerifyCase(name="single pair dense", batch=2, seq_len=33, heads=2, head_dim=8, segment_lengths=[33], dilation_rates=[1]),
    VerifyCase(name="LongNet-like", batch=1, seq_len=509, heads=8, head_dim=32, segment_lengths=[64, 128, 256], dilation_rates=[1, 2, 4]),
    VerifyCase(name="long ragged", batch=2, seq_len=1000, heads=6, head_dim=64, segment_lengths=[128, 512, 2048], dilation_rates=[1, 3, 8]),
]


def case_matrix(full: bool = False) -> list[VerifyCase]:
    return list(FULL if full else QUICK)


VERIFY_BLOCK_SIZE = 8  # small blocks, so the quick cases hold several, a ragged last one included


def block_options(case: VerifyCase, pattern: str, semantics: str = "longnet") -> dict:
    """Pattern options of the block-sparse implementations for `case`: a one-block window, one global
    block, two hierarchical levels; the case's segments (and semantics) for the patterns that use them."""
    from ..kernels.block_sparse.patterns import USES_WINDOW, block_sparse_options

    window = {"window": 1, "global_blocks": 1, "levels": 2} if pattern in USES_WINDOW else {}
    return block_sparse_options(pattern, case.segment_lengths, case.dilation_rates, semantics,
                                block_size=VERIFY_BLOCK_SIZE, **window)
