"""Fixtures of the Triton kernel tests (test_combine.py, test_merge_fused.py)."""

import pytest

from dattn_cli.kernels import merge_fused


@pytest.fixture
def interpret(monkeypatch):
    """Triton's interpreter for the test (kernels are decorated under the setting in force), the fused paths on."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(merge_fused.ENV, raising=False)


@pytest.fixture
def record_launches(monkeypatch):
    """record_launches(module) -> each call of module._launch from then on, in order: True where the kernel ran,
    False where it failed."""

    def record(module) -> list[bool]:
        ran: list[bool] = []
        launch = module._launch

        def counted(*args):
            ran.append(bool(launch(*args)))
            return ran[-1]

        monkeypatch.setattr(module, "_launch", counted)
        return ran

    return record
