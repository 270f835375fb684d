"""The fused Triton merge and gradient add (merge_fused.py) against the torch code and float64.

On CPU these run triton's interpreter (TRITON_INTERPRET=1, set per test: merge_triton.build decorates the
kernel under the setting in force, so the compiled kernel of the CUDA tests is unaffected); on CUDA the
compiled kernel. Small shapes: the interpreter runs every program in Python.
"""

import pytest
import torch

from dattn_cli.kernels import ImprovedDilatedAttention, combine, dilated_attention_reference, merge_fused
from dattn_cli.kernels.merge import accumulate_, merge_partial_

from .test_merge import NEG_INF, merge64, strided_case

pytest.importorskip("triton")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's log(0)


@pytest.fixture
def launches(record_launches):
    """The fused launches that ran (True) or failed (False)."""
    return record_launches(merge_fused)


def _fused_and_torch(case, monkeypatch):
    """(fused out, lse), (torch out, lse) of merging the case's block into copies of its accumulator views."""
    out_full, lse_full, out, lse, block_out, block_lse = case
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv(merge_fused.ENV, flag)
        of, lf = out_full.clone(), lse_full.clone()
        o, l_ = of[:, 1::3, ::2], lf[:, 1::3, ::2]
        merge_partial_(o, l_, block_out.clone(), block_lse.clone())
        results.append((of, lf, o, l_))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_merge_into_strided_views_matches_torch_and_float64(dtype, interpret, launches, monkeypatch):
    case = strided_case(dtype, seed=2)
    (of, lf, o, l_), (tf, tlf, to, tl_) = _fused_and_torch(case, monkeypatch)
    assert launches == [True]
    want_out, want_lse = merge64(*case[2:])
    assert not o.isnan().any() and not l_.isnan().any()
    torch.testing.assert_close(o.double(), want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(l_.double(), want_lse, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(of, tf, atol=1e-6, rtol=1e-5)  # the rows outside the views too
    torch.testing.assert_close(lf, tlf, atol=1e-6, rtol=1e-6)
    assert (l_[1, :2, 0] == NEG_INF).all() and (o[1, :2, 0] == 0).all()  # both sides empty: still empty


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_accumulate_matches_torch(dtype, interpret, launches):
    acc_full = torch.randn(2, 12, 4, 40)  # D = 40: a partial last column block
    acc = acc_full[:, 2::3, 1:4]
    value = torch.randn(acc.shape).to(dtype).transpose(1, 2).contiguous().transpose(1, 2)  # (b, h, m, D) memory
    want_full = acc_full.clone()
    want_full[:, 2::3, 1:4] += value.float()
    accumulate_(acc, value)
    assert launches == [True]
    assert torch.equal(acc_full, want_full)


def test_fast_path_selection(interpret, monkeypatch):
    out, lse = torch.zeros(2, 3, 4), torch.full((2, 3), NEG_INF)
    block_out, block_lse = torch.randn(2, 3, 4), torch.randn(2, 3)
    assert not merge_fused.merge_(out.double(), lse, block_out.double(), block_lse)  # fp64 stays on torch
    assert not merge_fused.merge_(out, lse, block_out[:, :2], block_lse[:, :2])  # shapes differ
    assert not merge_fused.accumulate_(torch.zeros(1, 3, 4).expand(2, 3, 4), block_out)  # broadcast accumulator
    assert not merge_fused.accumulate_(out, block_out.requires_grad_())  # autograd would not see the kernel
    many = torch.zeros(2, 2, 2, 2, 2, 4).permute(4, 2, 0, 3, 1, 5)  # five leading dims that cannot merge
    assert not merge_fused.accumulate_(many, torch.zeros(many.shape))
    monkeypatch.setenv(merge_fused.ENV, "0")
    assert not merge_fused.merge_(out, lse, block_out.detach(), block_lse)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.delenv(merge_fused.ENV)
    assert not merge_fused.enabled(torch.device("cpu"))  # CPU tensors without the interpreter: torch code
    assert merge_fused.enabled(torch.device("cuda"))


def test_collapse_merges_dimensions_all_tensors_allow():
    sizes, strides = merge_fused._collapse((2, 3, 4), [(12, 4, 1), (24, 8, 2)])
    assert sizes == [1, 1, 1, 24] and strides == [[0, 0, 0, 1], [0, 0, 0, 2]]
    sizes, strides = merge_fused._collapse((2, 3, 1, 4), [(12, 4, 4, 1), (40, 4, 9, 1)])
    assert sizes == [1, 1, 2, 12] and strides == [[0, 0, 12, 1], [0, 0, 40, 1]]


def _improved(xs, grad):
    module = ImprovedDilatedAttention([8, 16], [1, 2])
    out = module(*xs)
    return (out, *torch.autograd.grad(out, xs, grad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_improved_forward_backward_fast_path_equals_torch_code(dtype, interpret, launches, monkeypatch):
    """N = 40 (a ragged tail), 4 heads: merges into strided views and gradient adds, both by the kernel (the
    accumulating path: the one-pass combine, combine.py, turned off)."""
    monkeypatch.setattr(combine, "MAX_BLOCKS", 0)
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(1, 40, 4, 16, generator=g, dtype=torch.float64) for _ in range(4)]
    xs = [x.to(dtype).requires_grad_() for x in base[:3]]
    fused = _improved(xs, base[3].to(dtype))
    assert sum(launches) >= 6  # forward merges and backward adds of the second pair's blocks
    monkeypatch.setenv(merge_fused.ENV, "0")
    plain = _improved(xs, base[3].to(dtype))
    for f, p in zip(fused, plain):
        torch.testing.assert_close(f, p, atol=2e-6 if dtype == torch.float32 else 1e-3, rtol=1e-5)
    if dtype == torch.float32:
        rs = [x.clone().requires_grad_() for x in base[:3]]
        ref, _ = dilated_attention_reference(*rs, [8, 16], [1, 2])
        want = (ref, *torch.autograd.grad(ref, rs, base[3]))
        for f, r in zip(fused, want):
            torch.testing.assert_close(f.double(), r, atol=1e-5, rtol=1e-4)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernel_matches_torch(dtype, launches, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(merge_fused.ENV, raising=False)
    case = [x.cuda() for x in strided_case(dtype, seed=4)]
    case[2], case[3] = case[0][:, 1::3, ::2], case[1][:, 1::3, ::2]
    (of, lf, o, l_), (tf, tlf, _, _) = _fused_and_torch(case, monkeypatch)
    assert launches == [True]
    want_out, want_lse = merge64(*strided_case(dtype, seed=4)[2:])
    torch.testing.assert_close(o.double().cpu(), want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(of, tf, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lf, tlf, atol=1e-6, rtol=1e-6)
    monkeypatch.delenv(merge_fused.ENV)
    acc = torch.randn(2, 64, 8, 64, device="cuda")[:, ::2]
    value = torch.randn(acc.shape, device="cuda").to(dtype)
    want = acc + value.float()
    accumulate_(acc, value)
    assert launches == [True, True] and torch.equal(acc, want)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_improved_fast_path_equals_torch_code(dtype, launches, monkeypatch):
    monkeypatch.setattr(combine, "MAX_BLOCKS", 0)  # the accumulating path
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(merge_fused.ENV, raising=False)
    base = [torch.randn(2, 1000, 8, 64, device="cuda", dtype=torch.float64) for _ in range(4)]
    xs = [x.to(dtype).requires_grad_() for x in base[:3]]
    module = ImprovedDilatedAttention([128, 256, 512], [1, 2, 4])
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv(merge_fused.ENV, flag)
        out = module(*xs)
        results.append((out, *torch.autograd.grad(out, xs, base[3].to(dtype))))
    assert any(launches)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for f, p in zip(*results):
        torch.testing.assert_close(f.float(), p.float(), atol=tol, rtol=tol)


@pytest.mark.slow
@pytest.mark.parametrize(("block_dtype", "merge"), [("bf16", True), ("fp16", False)])
def test_kernel_compiles_for_sm90_without_a_device(block_dtype, merge):
    """The compiled (not interpreted) kernel builds down to an sm_90 cubin here, with triton's own ptxas."""
    pytest.importorskip("triton.backends.nvidia")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dattn_cli.kernels.merge_triton import build

    kernel = build(False)
    constexprs = {"MERGE": merge, "BLOCK_R": 64, "BLOCK_D": 64}
    pointers = {"acc": "*fp32", "lse": "*fp32", "block": f"*{block_dtype}", "blse": "*fp32"}
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i64") for n in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"]
