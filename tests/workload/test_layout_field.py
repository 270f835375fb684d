"""The shard layout as a Problem field: a key field of rows, passed to the classes that take it, and refused
in one line (naming --layout and the fix) where it cannot apply."""

import pytest

from dattn_cli.workload import Problem
from dattn_cli.workload.build import module_options
from dattn_cli.workload.records import KEY_FIELDS, BenchRow


def test_layout_is_a_key_field_defaulting_to_contiguous():
    assert "layout" in KEY_FIELDS
    assert Problem().layout == "contiguous" and BenchRow.model_fields["layout"].default == "contiguous"


def test_zigzag_reaches_the_ring_all_gather_and_block_sparse_constructors():
    for impl in (
        "RingDilatedAttention",
        "DistributedImprovedMultiheadDilatedAttention",
        "BlockSparseRingDilatedAttention",
    ):
        p = Problem(
            impl=impl, world_size=2, layout="zigzag", seq_len=4096, segment_lengths=[1024, 4096], dilation_rates=[1, 2]
        )
        assert module_options(p)["layout"] == "zigzag"
    assert "layout" not in module_options(Problem(impl="RingDilatedAttention", world_size=2))


@pytest.mark.parametrize(
    "fields, needle",
    [
        (dict(impl="HeadParallelDilatedAttention"), "HeadParallelDilatedAttention holds contiguous shards only"),
        (dict(impl="RingDilatedAttention", seq_len=8, documents=[3, 5], batch=1), "does not take packed --documents"),
        (dict(impl="BlockSparseRingDilatedAttention", pattern="sliding_window"), "does not take --pattern sliding"),
    ],
)
def test_what_cannot_take_zigzag_is_refused_in_one_line(fields, needle):
    with pytest.raises(ValueError, match=f"--layout zigzag.*{needle}|{needle}.*--layout contiguous") as info:
        Problem(world_size=2, layout="zigzag", **fields)
    assert "--layout contiguous" in str(info.value)


def test_verify_refuses_zigzag_for_implementations_that_cannot_take_it():
    from dattn_cli.verify import collect_checks

    with pytest.raises(ValueError, match="^--layout zigzag: HeadParallelDilatedAttention take contiguous shards only"):
        collect_checks(["HeadParallelDilatedAttention"], world_sizes=[2], layout="zigzag")
