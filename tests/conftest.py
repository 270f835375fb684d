import pytest
import torch

from dattn_cli.kernels import reset_global_memory_pool, reset_global_pattern_cache


@pytest.fixture(autouse=True)
def _fresh_state():
    torch.manual_seed(0)
    reset_global_pattern_cache()
    reset_global_memory_pool()
    yield


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(got)), "non-finite entries differ"
    if not finite.any():
        return 0.0
    return ((got[finite] - ref[finite]).abs().max() / ref[finite].abs().max().clamp_min(1e-300)).item()
