"""workload/records.py: a bench row and the Problem it measured, both ways."""

import pytest

from dattn_cli.workload import Problem
from dattn_cli.workload.records import KEY_FIELDS, BenchRow, point_key, row_fields, row_problem

MULTIHEAD = "ImprovedMultiheadDilatedAttention"


@pytest.mark.parametrize(
    "problem",
    [
        Problem(),
        Problem(kv_heads=2, causal=True, mode="fwdbwd", documents=[4096, 4096]),
        Problem(impl=MULTIHEAD, target="layer", amp="bf16", checkpointing=True),
        Problem(impl=MULTIHEAD, target="model", layers=3, vocab_size=1000),
    ],
)
def test_a_row_gives_back_the_problem_it_measured(problem):
    fields = row_fields(problem)
    assert set(KEY_FIELDS) <= set(fields) and fields["segments"] == problem.segment_lengths
    row = BenchRow(**fields, status="ok")
    assert row_problem(row) == problem and row.key() == point_key(fields)


def test_attention_rows_leave_the_layer_fields_unset():
    fields = row_fields(Problem(embed_dim=512, layers=4))
    assert (fields["embed_dim"], fields["layers"], fields["vocab_size"]) == (None, None, None)
    layer = row_fields(Problem(impl=MULTIHEAD, target="layer", heads=4, head_dim=32))
    assert (layer["embed_dim"], layer["layers"], layer["vocab_size"]) == (128, 1, None)
