"""`python -m dattn_cli` and `python -m dattn_cli.cli` are the `dattn` console script."""

import runpy
import sys

import pytest

from dattn_cli import __version__


@pytest.mark.parametrize("module", ["dattn_cli", "dattn_cli.cli"])
def test_python_dash_m_runs_the_cli(module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dattn", "--version"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    assert done.value.code in (0, None) and __version__ in capsys.readouterr().out
