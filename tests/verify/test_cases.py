"""The blocks of the block-sparse checks: 8 tokens on the case matrix (each case holds several), the Problem's
block size on your configuration (as bench and plan run it), --block-size over both."""

import pytest

from dattn_cli.verify.cases import VERIFY_BLOCK_SIZE, case_matrix, own_cases
from dattn_cli.verify.run import collect_checks
from tests.cli.test_verify_env import run_cli

IMPL = "BlockSparseRingDilatedAttention"
SHAPE = dict(heads=4, head_dim=8, segment_lengths=[128, 256], dilation_rates=[1, 2])


def block_sizes(cases, **options) -> set[int]:
    checks = collect_checks([IMPL], cases=cases, semantics=["longnet"], causal=[False], **options)
    return {v.problem.block_size for v in checks.single}


def test_the_case_matrix_checks_small_blocks_and_your_configuration_its_own():
    assert block_sizes(case_matrix()[:2]) == {VERIFY_BLOCK_SIZE}
    assert block_sizes(own_cases([512], **SHAPE)) == {128}  # the Problem's default, what bench runs
    assert block_sizes(own_cases([512], **SHAPE), block_size=32) == {32}
    assert block_sizes(case_matrix()[:2], block_size=16) == {16}


@pytest.mark.parametrize("value", ["0", "-8"])
def test_a_bad_block_size_is_one_line_naming_it(value, capsys):
    code, stdout, err = run_cli(["verify", "--impl", IMPL, "--seq-len", "256", "--block-size", value], capsys)
    assert code == 2 and "--block-size must be an integer from 1" in err and "Traceback" not in err
