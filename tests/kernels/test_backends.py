"""Backend helpers: batch slicing of the fused ops (the CUDA flash and cuDNN ops past 2**31 elements)."""

import pytest
import torch

from dattn_cli.kernels.backends import BACKENDS, BlockCall
from dattn_cli.kernels.block_kernels import batch_sliced


def _cpu_flash(q, k, v):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=0.25)


def _inputs(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    # (b, h, m, D) views of (b, m, h, D) memory, as the engine passes gathered blocks
    return [torch.randn(7, 33, 3, 16, dtype=dtype, device=device).transpose(1, 2) for _ in range(3)]


def test_batch_sliced_equals_one_call_and_keeps_the_layout():
    q, k, v = _inputs()
    whole = _cpu_flash(q, k, v)
    sliced = batch_sliced(_cpu_flash, (q, k, v), max_elements=2 * q[0].numel())  # 4 slices of <= 2
    for a, b in zip(whole, sliced):
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_batch_sliced_one_call_below_the_limit():
    calls = []

    def op(*xs):
        calls.append(xs[0].shape[0])
        return _cpu_flash(*xs)

    batch_sliced(op, _inputs(), max_elements=1 << 30)
    assert calls == [7]


def test_batch_sliced_slice_smaller_than_one_item_still_progresses():
    q, k, v = _inputs()
    out, _ = batch_sliced(_cpu_flash, (q, k, v), max_elements=1)
    torch.testing.assert_close(out, _cpu_flash(q, k, v)[0], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernel", ["fa2", "cudnn"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_flash_op_sliced_equals_unsliced(monkeypatch, kernel, causal):
    import dattn_cli.kernels.block_kernels as block_kernels

    monkeypatch.setenv("DATTN_BLOCK_KERNEL", kernel)
    q, k, v = _inputs("cuda", torch.bfloat16)
    dout = torch.randn_like(q)
    call = BlockCall(causal=causal, scale=0.25)
    sdpa = BACKENDS["sdpa"]
    out, lse = sdpa.forward(q, k, v, None, call)
    grads = sdpa.backward(dout, q, k, v, out, lse, None, call)
    monkeypatch.setattr(block_kernels, "FLASH_OP_MAX_ELEMENTS", 2 * q[0].numel())
    out2, lse2 = sdpa.forward(q, k, v, None, call)
    grads2 = sdpa.backward(dout, q, k, v, out2, lse2, None, call)
    for a, b in zip((out, lse, *grads), (out2, lse2, *grads2)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
