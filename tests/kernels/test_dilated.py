"""DilatedAttention and ImprovedDilatedAttention against the reference: forward, lse and gradients."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention, dilated_attention_reference
from tests.conftest import rel_err

CORE = [DilatedAttention, ImprovedDilatedAttention]
SHAPES = [
    # (B, N, H, D, segs, rates): ragged N, w > N, w % r != 0, H not divisible by m or r
    (2, 50, 4, 8, [16, 32], [1, 2]),
    (1, 24, 4, 8, [8, 64], [1, 4]),
    (1, 45, 3, 8, [10, 15], [3, 4]),
    (2, 40, 5, 8, [8, 16, 32], [1, 2, 3]),
    (3, 64, 4, 16, [16, 32], [1, 2]),
]


def random_inputs(B, N, H, D):
    return [torch.randn(B, N, H, D, dtype=torch.float64) for _ in range(4)]  # q, k, v, upstream grad


def run(fn, inputs, dtype):
    """fn(q, k, v) -> (out, lse); returns out, lse, (dq, dk, dv) for inputs cast to dtype."""
    *base, upstream = inputs
    xs = [x.to(dtype).requires_grad_() for x in base]
    out, lse = fn(*xs)
    return out, lse, torch.autograd.grad(out, xs, upstream.to(out.dtype))


def check(module, B, N, H, D, segs, rates, causal, semantics, dtype=torch.float32, **kw):
    inputs = random_inputs(B, N, H, D)
    out, lse, grads = run(lambda q, k, v: module.forward_with_lse(q, k, v, causal, **kw), inputs, dtype)
    ref, ref_lse, ref_grads = run(
        lambda q, k, v: dilated_attention_reference(q, k, v, segs, rates, causal, semantics, module.scale, **kw),
        inputs,
        torch.float64,
    )
    return out, lse, grads, ref, ref_lse, ref_grads


@pytest.mark.parametrize("cls", CORE)
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,N,H,D,segs,rates", SHAPES)
def test_fp32_matches_reference(cls, backend, semantics, causal, B, N, H, D, segs, rates):
    module = cls(segs, rates, semantics=semantics, backend=backend)
    out, lse, grads, ref, ref_lse, ref_grads = check(module, B, N, H, D, segs, rates, causal, semantics)
    assert out.dtype == torch.float32 and out.shape == (B, N, H, D)
    assert rel_err(out, ref) <= 1e-5
    assert rel_err(lse, ref_lse) <= 1e-5
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= 1e-4


@pytest.mark.parametrize("cls", CORE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_within_twice_naive_error(cls, dtype):
    """flash-attn's rule: error vs fp64 <= 2 x the error of a naive same-dtype computation + 1e-3."""
    segs, rates = [32, 64], [1, 2]
    inputs = random_inputs(2, 96, 4, 16)
    module = cls(segs, rates, backend="sdpa")
    got = run(lambda q, k, v: module.forward_with_lse(q, k, v, True), inputs, dtype)
    ref = run(lambda q, k, v: dilated_attention_reference(q, k, v, segs, rates, True), inputs, torch.float64)
    naive = run(
        lambda q, k, v: dilated_attention_reference(q, k, v, segs, rates, True, compute_dtype=dtype), inputs, dtype
    )
    assert got[0].dtype == dtype
    for g, n, r in [(got[0], naive[0], ref[0]), *zip(got[2], naive[2], ref[2])]:
        err = (g.double() - r).abs().max().item()
        naive_err = (n.double() - r).abs().max().item()
        assert err <= 2 * naive_err + 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("cls", CORE)
def test_gradcheck_float64_through_merge(cls):
    """Exact gradients through the pair merge: torch.autograd.gradcheck in float64."""
    module = cls([4, 8], [1, 2], backend="math")
    xs = [torch.randn(1, 10, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda q, k, v: module(q, k, v, is_causal=True), xs)


def test_detached_merge_weights_would_be_caught():
    """The merge-weight gradient is not small: dropping it changes dq by far more than 1e-4."""
    segs, rates = [8, 16], [1, 2]
    q, k, v = (torch.randn(1, 32, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, _ = dilated_attention_reference(q, k, v, segs, rates)
    g = torch.randn_like(out)
    (dq_exact,) = torch.autograd.grad(out, q, g)
    outs = [dilated_attention_reference(q, k, v, [w], [r]) for w, r in zip(segs, rates)]
    lse = torch.stack([o[1] for o in outs]).double()
    weights = torch.softmax(lse, dim=0).detach()
    out_detached = sum(w.unsqueeze(-1) * o[0] for w, o in zip(weights, outs))
    (dq_detached,) = torch.autograd.grad(out_detached, q, g)
    assert torch.allclose(out_detached, out)
    assert rel_err(dq_detached, dq_exact) > 1e-2


@pytest.mark.parametrize("cls", CORE)
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_key_padding_mask_matches_reference(cls, backend):
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[0, 30:] = True
    mask[1, 5:14] = True  # whole segments of pair 0 masked: their rows rely on the other pair
    module = cls([8, 16], [1, 2], backend=backend)
    out, lse, grads, ref, ref_lse, ref_grads = check(
        module, 2, 40, 4, 8, [8, 16], [1, 2], True, "longnet", key_padding_mask=mask
    )
    assert rel_err(out, ref) <= 1e-5 and rel_err(lse, ref_lse) <= 1e-5
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= 1e-4


@pytest.mark.parametrize("cls", CORE)
def test_scale_is_honoured(cls):
    q, k, v = (torch.randn(1, 32, 2, 8) for _ in range(3))
    default = cls([8, 16], [1, 2])(q, k, v)
    scaled = cls([8, 16], [1, 2], scale=0.05)(q, k, v)
    ref, _ = dilated_attention_reference(q, k, v, [8, 16], [1, 2], scale=0.05)
    assert rel_err(scaled, ref) <= 1e-5
    assert (scaled - default).abs().max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("cls", CORE)
def test_dropout_applies_in_training_only_and_backward_is_exact(cls):
    module = cls([4, 8], [1, 2], dropout=0.3)
    q, k, v = (torch.randn(1, 16, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    module.eval()
    ref, _ = dilated_attention_reference(q, k, v, [4, 8], [1, 2])
    assert rel_err(module(q, k, v), ref) < 1e-10
    module.train()
    torch.manual_seed(3)
    a = module(q, k, v)
    assert (a - ref).abs().max() > 1e-3
    torch.manual_seed(3)
    assert torch.equal(a, module(q, k, v))  # the mask follows torch's RNG

    def fixed_mask(q, k, v):
        torch.manual_seed(7)
        return module(q, k, v)

    assert torch.autograd.gradcheck(fixed_mask, (q, k, v))


class _MaxNumel(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize("cls", CORE)
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_no_n_by_n_tensor_and_linear_growth(cls, backend):
    """Largest tensor any op creates, forward + backward, is linear in N for fixed segments."""
    sizes = {}
    for n in (2048, 4096):
        q, k, v = (torch.randn(1, n, 2, 8, requires_grad=True) for _ in range(3))
        module = cls([64, 128], [1, 2], backend=backend)
        with _MaxNumel() as probe:
            module(q, k, v, is_causal=True).sum().backward()
        sizes[n] = probe.max_numel
        assert probe.max_numel < n * n
    assert sizes[4096] <= 2.05 * sizes[2048]


@pytest.mark.parametrize("cls", CORE)
def test_output_dtype_and_type_stable(cls):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        q = torch.randn(1, 16, 2, 8, dtype=dtype)
        out = cls([8], [1])(q, q, q)
        assert type(out) is torch.Tensor and out.dtype == dtype


def test_implementations_agree_and_improved_matches_dilated():
    q, k, v = (torch.randn(2, 100, 6, 16) for _ in range(3))
    a = DilatedAttention([16, 32, 64], [1, 2, 4])(q, k, v, is_causal=True)
    b = ImprovedDilatedAttention([16, 32, 64], [1, 2, 4])(q, k, v, is_causal=True)
    assert rel_err(b, a) < 1e-6
