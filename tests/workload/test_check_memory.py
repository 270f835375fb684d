"""The memory model of a verify check, and verify's refusal of a check that does not fit."""

import pytest

from dattn_cli.verify import collect_checks, own_cases
from dattn_cli.workload.check_memory import check_items, reference_items
from dattn_cli.workload.problem import Problem
from tests.cli.test_verify_env import run_cli


def problem(n, **kw):
    return Problem(impl="DilatedAttention", seq_len=n, heads=8, head_dim=64, mode="fwdbwd", **kw)


def test_the_dense_reference_counts_the_scores_autograd_saves():
    p = problem(16384)
    dense = reference_items(p, local=False, chunk_elements=0)
    assert dense["saved scores"] == 2 * 8 * 16384**2 * 8  # B x H x N^2, twice, in float64: 32 GiB
    local = reference_items(p, local=True, chunk_elements=1 << 22)
    assert "saved scores" not in local and sum(local.values()) < sum(dense.values()) / 10


def test_the_local_check_grows_linearly_with_n():
    small, large = (check_items(problem(n), True, 1 << 22)[1] for n in (16384, 65536))
    assert large < 4.5 * small
    assert check_items(problem(16384, dtype="bfloat16"), True, 1 << 22)[0]["naive computation"] > 0


def test_verify_refuses_a_check_that_does_not_fit(monkeypatch):
    import dattn_cli.verify.run as run

    monkeypatch.setattr(run, "available_memory_bytes", lambda: 2**30)
    with pytest.raises(ValueError) as err:
        collect_checks(
            ["ImprovedDilatedAttention"], cases=own_cases([65536], heads=8), semantics=["longnet"], causal=[False]
        )
    message = str(err.value)
    assert "GiB" in message and "1.0 GiB available" in message and "--seq-len" in message
    assert "\n" not in message


def test_the_cli_refusal_is_one_line_and_exit_2(monkeypatch, capsys):
    import dattn_cli.verify.run as run

    monkeypatch.setattr(run, "available_memory_bytes", lambda: 2**30)
    code, _, err = run_cli(["verify", "--seq-len", "64k", "--impl", "ImprovedDilatedAttention"], capsys)
    assert code == 2 and "verify needs about" in err and "available" in err
