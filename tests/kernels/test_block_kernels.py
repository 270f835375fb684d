"""block_kernels.py on CPU: the aten ops' schemas and shapes as the kernels call them (meta tensors), the cuDNN
fallback said once, the strided-block rule, flash detection with stand-in packages, and FA4's argument plumbing
through a stand-in `flash_attn.cute` that computes attention with plain torch."""

import warnings

import pytest
import torch

import dattn_cli.kernels.block_kernels as bk
from dattn_cli.kernels.backends import BlockCall

aten = torch.ops.aten


def _names(op) -> list[str]:
    return [a.name for a in op.default._schema.arguments]


def test_cudnn_and_fa2_schemas_are_the_ones_the_kernels_call():
    """The kernels pass these arguments by position: a torch that reorders them must fail here first."""
    assert _names(aten._scaled_dot_product_cudnn_attention) == [
        "query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "return_debug_mask",
        "scale",
    ]  # fmt: skip
    assert _names(aten._scaled_dot_product_cudnn_attention_backward) == [
        "grad_out", "query", "key", "value", "out", "logsumexp", "philox_seed", "philox_offset", "attn_bias",
        "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "scale",
    ]  # fmt: skip
    assert _names(aten._scaled_dot_product_flash_attention) == [
        "query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale",
    ]  # fmt: skip
    assert _names(aten._scaled_dot_product_flash_attention_backward) == [
        "grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
        "dropout_p", "is_causal", "philox_seed", "philox_offset", "scale",
    ]  # fmt: skip


def _meta_block(dtype=torch.bfloat16, b=3, m=192, h=4, d=64):
    """(b, h, m, D) views of (b, m, h, D) memory, as the engine passes r = 1 blocks."""
    return [torch.empty(b, m, h, d, device="meta", dtype=dtype).transpose(1, 2) for _ in range(4)]


class RecordingAten:
    """torch.ops.aten with the calls of `names` recorded (and `fail` ones raising)."""

    def __init__(self, fail=(), error=RuntimeError):
        self.calls, self.fail, self.error = [], set(fail), error

    def __getattr__(self, name):
        real = getattr(aten, name)

        def op(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name in self.fail:
                raise self.error(f"{name} refused (stand-in)")
            return real(*args, **kwargs)

        return op


@pytest.fixture
def fresh_fallback(monkeypatch):
    monkeypatch.setattr(bk, "_said_fallback", False)
    monkeypatch.setattr(bk, "_CUDNN_FAILED", set())
    bk.reset_kernels_used()
    yield
    bk.reset_kernels_used()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_kernel_on_meta_tensors(monkeypatch, fresh_fallback, dtype, causal):
    recorder = RecordingAten()
    monkeypatch.setattr(bk, "aten", recorder)
    q, k, v, dout = _meta_block(dtype)
    call = BlockCall(causal=causal, scale=0.125)
    out, lse = bk.KERNELS["cudnn"].forward(q, k, v, None, call)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    name, args, kwargs = recorder.calls[-1]
    assert name == "_scaled_dot_product_cudnn_attention" and args[3] is None and args[4] is True  # no mask, lse
    assert args[6] is causal and kwargs["scale"] == 0.125
    merged_lse = torch.empty(3, 192, 4, device="meta").transpose(1, 2)  # the engine's strided (b, h, m) view
    grads = bk.KERNELS["cudnn"].backward(dout, q, k, v, out, merged_lse, None, call)
    name, args, kwargs = recorder.calls[-1]
    assert name == "_scaled_dot_product_cudnn_attention_backward"
    lse_arg = args[5]
    assert lse_arg.shape == (3, 4, 192, 1) and lse_arg.dtype == torch.float32 and lse_arg.is_contiguous()
    assert args[8] is None and args[9] is None and args[10] is None  # no bias, dense (not nested)
    assert args[11:15] == (192, 192, 0.0, causal)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == dtype
    assert bk.kernels_used() is None  # the dispatcher notes the kernel; no fallback happened


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fa2_op_on_meta_tensors(dtype):
    q, k, v, dout = _meta_block(dtype, m=320)
    call = BlockCall(causal=True, scale=0.125)
    out, lse = bk.KERNELS["fa2"].forward(q, k, v, None, call)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    grads = bk.KERNELS["fa2"].backward(dout, q, k, v, out, lse, None, call)
    assert [g.shape for g in grads] == [q.shape] * 3 and all(g.dtype == dtype for g in grads)


def test_a_failing_cudnn_call_runs_the_fa2_op_and_says_so_once(monkeypatch, fresh_fallback):
    recorder = RecordingAten(
        fail={"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}
    )
    monkeypatch.setattr(bk, "aten", recorder)
    q, k, v, dout = _meta_block()
    call = BlockCall(causal=False, scale=0.125)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            out, lse = bk.KERNELS["cudnn"].forward(q, k, v, None, call)
            grads = bk.KERNELS["cudnn"].backward(dout, q, k, v, out, lse, None, call)
    said = [w for w in caught if "cuDNN attention call failed" in str(w.message)]
    assert len(said) == 1 and "FA2" in str(said[0].message)
    called = [name for name, _, _ in recorder.calls]
    # each direction tried cuDNN once; the second round went straight to the fa2 op (signature remembered)
    assert called.count("_scaled_dot_product_cudnn_attention") == 1
    assert called.count("_scaled_dot_product_cudnn_attention_backward") == 1
    assert called.count("_scaled_dot_product_flash_attention") == 2
    assert called.count("_scaled_dot_product_flash_attention_backward") == 2
    assert out.shape == q.shape and [g.shape for g in grads] == [q.shape] * 3
    assert bk.kernels_used() == "fa2"


def test_out_of_memory_in_cudnn_is_not_hidden_by_the_fallback(monkeypatch, fresh_fallback):
    monkeypatch.setattr(
        bk, "aten", RecordingAten(fail={"_scaled_dot_product_cudnn_attention"}, error=torch.OutOfMemoryError)
    )
    q, k, v, _ = _meta_block()
    with pytest.raises(torch.OutOfMemoryError):
        bk.KERNELS["cudnn"].forward(q, k, v, None, BlockCall(causal=False, scale=0.125))


# --- the strided-block rule ----------------------------------------------------------------------------------------
def _dilated_view(dtype=torch.float32, d=16, r=2):
    x = torch.randn(2, 64, 4, d, dtype=dtype)
    return x.unflatten(1, (2, 32))[:, :, 1::r, 0:4:2].flatten(0, 1)  # (b, m, h, D), as ViewAccess.gather sees it


def test_takes_view_rule(monkeypatch):
    monkeypatch.delenv("DATTN_BLOCK_LAYOUT", raising=False)
    view = _dilated_view()
    assert bk.takes_view("math", view) and bk.takes_view("fa2", view) and bk.takes_view("cudnn", view)
    assert not bk.takes_view("cpu-flash", view)  # auto: copies measured faster there
    assert not bk.takes_view("math", torch.randn(4, 8, 32)[..., ::2])  # strided last dimension
    assert not bk.takes_view("math", _dilated_view(torch.float32, d=3))  # strides of 12 bytes: not 16-byte aligned
    assert not bk.takes_view("math", torch.randn(4 * 8 * 16 + 1)[1:].view(4, 8, 16))  # data pointer off by 4 bytes
    monkeypatch.setenv("DATTN_BLOCK_LAYOUT", "view")
    assert bk.takes_view("cpu-flash", view) and not bk.takes_view("cpu-flash", torch.randn(4, 8, 32)[..., ::2])
    monkeypatch.setenv("DATTN_BLOCK_LAYOUT", "copy")
    assert not bk.takes_view("math", view) and not bk.takes_view("fa2", view)
    monkeypatch.setenv("DATTN_BLOCK_LAYOUT", "sideways")
    with pytest.raises(ValueError, match="DATTN_BLOCK_LAYOUT='sideways' is unknown: use auto, view or copy"):
        bk.takes_view("math", view)


def test_cpu_flash_op_needs_a_contiguous_last_dimension_not_contiguous_rows():
    """Why the rule is what it is: strided rows give the contiguous copy's result bit for bit, a strided last
    dimension a wrong one (no error)."""
    torch.manual_seed(0)
    views = [_dilated_view().transpose(1, 2) for _ in range(4)]
    copies = [v.contiguous() for v in views]
    for causal in (False, True):
        a = aten._scaled_dot_product_flash_attention_for_cpu(*views[:3], 0.0, causal, scale=0.3)
        b = aten._scaled_dot_product_flash_attention_for_cpu(*copies[:3], 0.0, causal, scale=0.3)
        ga = aten._scaled_dot_product_flash_attention_for_cpu_backward(views[3], *views[:3], *a, 0.0, causal, scale=0.3)
        gb = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            copies[3], *copies[:3], *b, 0.0, causal, scale=0.3
        )
        for x, y in zip((*a, *ga), (*b, *gb)):
            assert torch.equal(x, y)
    strided = [torch.randn(2, 4, 32, 32)[..., ::2] for _ in range(3)]
    odd = aten._scaled_dot_product_flash_attention_for_cpu(*strided, 0.0, False, scale=0.3)[0]
    right = aten._scaled_dot_product_flash_attention_for_cpu(*[s.contiguous() for s in strided], 0.0, False, scale=0.3)[
        0
    ]
    assert not torch.allclose(odd, right, atol=1e-3)  # if torch fixes this, the rule may relax
