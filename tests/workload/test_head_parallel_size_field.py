"""The hybrid's h (head_parallel_size) as a Problem field: a key field of rows, an option of verify and bench, its
default, the shard length it implies, and impossible h x ring layouts refused in one line."""

import pytest

from dattn_cli.kernels.registry import REGISTRY, shard_length
from dattn_cli.workload import Problem
from dattn_cli.workload.records import KEY_FIELDS, BenchRow

HYBRID = dict(impl="HybridDilatedAttention", seq_len=64, segment_lengths=[16, 64], dilation_rates=[1, 2])


def test_head_parallel_size_is_a_key_field_defaulting_to_none():
    assert "head_parallel_size" in KEY_FIELDS
    assert Problem().head_parallel_size is None and BenchRow.model_fields["head_parallel_size"].default is None


def test_default_h_is_two_where_it_divides_ranks_and_heads():
    assert Problem(**HYBRID, world_size=4, heads=8).hybrid_size == 2
    assert Problem(**HYBRID, world_size=3, heads=8).hybrid_size == 1
    assert Problem(**HYBRID, world_size=4, heads=5).hybrid_size == 1
    assert Problem(**HYBRID, world_size=8, heads=8, head_parallel_size=4).hybrid_size == 4


def test_shard_length_aligns_the_ring_over_the_blocks():
    # 2x2 over N = 50: the ring of 2 needs shards aligned with 16 and 64 -> 64 positions, 16 per rank
    p = Problem(**{**HYBRID, "seq_len": 50}, world_size=4, heads=8)
    assert shard_length(p, 4) == 16
    zigzag = Problem(**{**HYBRID, "seq_len": 50}, world_size=4, heads=8, layout="zigzag")
    assert shard_length(zigzag, 4) * 4 % 8 == 0  # 2p chunks


def test_impossible_layouts_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"--head-parallel-size 3 does not divide --world-size 4"):
        Problem(**HYBRID, world_size=4, head_parallel_size=3)
    rule = REGISTRY["HybridDilatedAttention"].shard_rule
    assert rule(Problem(**HYBRID, world_size=4, heads=6, head_parallel_size=4), 4).startswith(
        "6 heads cannot be split over head_parallel_size=4"
    )
    assert rule(Problem(**HYBRID, world_size=4, heads=8), 4) is None


def test_the_option_reaches_verify_and_bench():
    from dattn_cli.workload.problem_options import HEAD_PARALLEL_SIZE_OPTION

    assert set(HEAD_PARALLEL_SIZE_OPTION.commands) == {"verify", "bench"}
