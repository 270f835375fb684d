"""The dense baselines measured beside the dilated classes: cudnn is sdpa forced to the cuDNN kernel (never a
silent fallback), flash4 is FlashAttention-4 and says why it cannot run where flash_attn.cute does not import."""

import sys

import pytest
import torch

from dattn_cli.kernels import baselines
from dattn_cli.kernels.baselines import CuDNNAttention, SDPAAttention
from dattn_cli.kernels.registry import REGISTRY


def test_cudnn_never_falls_back_to_another_kernel():
    q = torch.randn(1, 64, 2, 16)
    with pytest.raises(RuntimeError):  # no cuDNN kernel on CPU: an error, not another kernel's answer
        CuDNNAttention()(q, q, q)


def test_dense_entries_are_baselines_with_their_devices():
    for name in ("flash4", "cudnn"):
        spec = REGISTRY[name]
        assert spec.baseline and spec.strategy == "dense" and spec.devices == ("cuda",)
        assert "cpu" in spec.unavailable("cpu")


def test_flash4_says_why_flash_attn_cute_does_not_import(monkeypatch, tmp_path):
    package = tmp_path / "flash_attn" / "cute"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "interface.py").write_text("import cutlass_dsl_that_is_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    baselines.fa4_import_error.cache_clear()
    try:
        reason = REGISTRY["flash4"].unavailable("cuda")
        assert "flash_attn.cute does not import" in reason and "cutlass_dsl_that_is_not_here" in reason
    finally:
        baselines.fa4_import_error.cache_clear()
        for name in [m for m in sys.modules if m.startswith("flash_attn")]:
            sys.modules.pop(name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN attention runs on CUDA")
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_equals_sdpa_on_cuda(causal):
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = CuDNNAttention()(q, k, v, is_causal=causal)
    ref = SDPAAttention()(q.double(), k.double(), v.double(), is_causal=causal)
    assert (out.double() - ref).abs().max() <= 2e-2
