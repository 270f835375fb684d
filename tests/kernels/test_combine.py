"""The one-pass combine (combine.py, combine_triton.py) against the accumulating path and float64.

On CPU under triton's interpreter (TRITON_INTERPRET=1, set per test), on CUDA the compiled kernel. The
accumulating path (DATTN_FUSED_MERGE=0: merge.py's torch code, block by block) is the comparison.
"""

import pytest
import torch

from dattn_cli.kernels import (
    DilatedAttention,
    ImprovedDilatedAttention,
    combine,
    dilated_attention_reference,
    merge_fused,
)
from dattn_cli.kernels.pattern import build_blocks

pytest.importorskip("triton")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's log(0)


@pytest.fixture
def launches(record_launches):
    """The one-pass launches that ran (True) or failed (False)."""
    return record_launches(combine)


def inputs(shape, dtype, seed=0, kv_heads=None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    b, n, h, d = shape
    shapes = [shape, (b, n, kv_heads or h, d), (b, n, kv_heads or h, d), shape]
    base = [torch.randn(s, generator=g, dtype=torch.float64).to(device) for s in shapes]
    return base, [x.to(dtype).requires_grad_() for x in base[:3]], base[3].to(dtype)


def outputs(module, xs, grad, **options):
    out, lse = module.forward_with_lse(*xs, **options)
    return (out, lse, *torch.autograd.grad(out, xs, grad))


CASES = {
    "longnet 3 pairs": dict(segs=[16, 32, 64], rates=[1, 2, 4], shape=(2, 128, 8, 16)),
    "ragged tail, causal": dict(segs=[16, 32, 64], rates=[1, 2, 4], shape=(1, 100, 6, 8), causal=True),
    "w > N, w % r != 0": dict(segs=[48, 96], rates=[1, 5], shape=(2, 40, 3, 8)),
    "head_groups": dict(segs=[16, 32], rates=[1, 3], shape=(1, 100, 5, 8), semantics="head_groups"),
    "GQA": dict(segs=[16, 32], rates=[1, 2], shape=(1, 64, 4, 16), kv_heads=2),
    "chunks": dict(segs=[8, 16], rates=[1, 2], shape=(1, 80, 4, 8), chunk=16 * 4 * 8),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_combined_equals_accumulated_and_float64(name, dtype, interpret, launches, monkeypatch):
    case = CASES[name]
    module = ImprovedDilatedAttention(
        case["segs"],
        case["rates"],
        semantics=case.get("semantics", "longnet"),
        sequence_chunk_elements=case.get("chunk"),
    )
    base, xs, grad = inputs(case["shape"], dtype, kv_heads=case.get("kv_heads"))
    causal = case.get("causal", False)
    combined = outputs(module, xs, grad, is_causal=causal)
    assert launches and all(launches)
    chunks = -(-case["shape"][1] // 16) if "chunk" in case else 1
    assert len(launches) == 4 * chunks  # one merge and three sums per chunk
    monkeypatch.setenv(merge_fused.ENV, "0")
    accumulated = outputs(module, xs, grad, is_causal=causal)
    assert len(launches) == 4 * chunks
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)
    for c, a in zip(combined, accumulated):
        assert c.dtype == a.dtype and c.shape == a.shape
        torch.testing.assert_close(c, a, **tol)
    if dtype == torch.float32:
        rs = [x.clone().requires_grad_() for x in base[:3]]
        semantics = case.get("semantics", "longnet")
        ref, _ = dilated_attention_reference(*rs, case["segs"], case["rates"], semantics=semantics, is_causal=causal)
        want = (ref, *torch.autograd.grad(ref, rs, base[3]))
        for c, r in zip(combined[:1] + combined[2:], want):
            torch.testing.assert_close(c.double(), r, atol=1e-5, rtol=1e-4)


def test_rows_no_block_holds_get_zero_and_minus_inf(interpret, launches):
    """One pair of rate 2 over one head: the odd positions are held by no block."""
    module = ImprovedDilatedAttention([8], [2])
    _, xs, grad = inputs((1, 16, 1, 8), torch.float32)
    out, lse, dq, dk, dv = outputs(module, xs, grad)
    assert launches == [True] * 4
    assert (out[:, 1::2] == 0).all() and (lse[:, 1::2] == float("-inf")).all()
    assert all((g[:, 1::2] == 0).all() for g in (dq, dk, dv))
    assert (out[:, ::2] != 0).all() and torch.isfinite(lse[:, ::2]).all()


def test_key_padding_mask_through_the_combine(interpret, launches, monkeypatch):
    module = ImprovedDilatedAttention([8, 16], [1, 2])
    _, xs, grad = inputs((2, 32, 4, 8), torch.float32, seed=5)
    pad = torch.zeros(2, 32, dtype=torch.bool)
    pad[0, 5:12] = True  # a whole r = 1 segment of keys masked for some rows
    combined = outputs(module, xs, grad, key_padding_mask=pad)
    assert launches and all(launches)
    monkeypatch.setenv(merge_fused.ENV, "0")
    for c, a in zip(combined, outputs(module, xs, grad, key_padding_mask=pad)):
        torch.testing.assert_close(c, a, atol=2e-6, rtol=1e-5)


def test_where_the_combine_does_not_apply(interpret, launches):
    _, xs, grad = inputs((1, 32, 4, 8), torch.float32)
    outputs(DilatedAttention([8, 16], [1, 2]), xs, grad)  # rows gathered by index: the accumulating path
    _, xs64, grad64 = inputs((1, 32, 4, 8), torch.float64)
    outputs(ImprovedDilatedAttention([8, 16], [1, 2]), xs64, grad64)  # float64 stays on torch
    assert launches == []
    many = build_blocks(512, 8, [2**i for i in range(3, 10)], [1, 2, 4, 8, 8, 8, 8], "longnet")
    assert len(many) > combine.MAX_BLOCKS and not combine.applies(xs[0], len(many))


def test_a_failing_launch_falls_back_once_and_says_so(interpret, monkeypatch):
    def broken(interpret):
        raise RuntimeError("no such triton feature")

    monkeypatch.setattr("dattn_cli.kernels.combine_triton.build", broken)
    monkeypatch.setattr(combine, "_failed", [])
    module = ImprovedDilatedAttention([8, 16], [1, 2])
    _, xs, grad = inputs((1, 32, 4, 8), torch.float32)
    with pytest.warns(RuntimeWarning, match="one-pass combine failed.*no such triton feature"):
        fallen = outputs(module, xs, grad)
    assert not combine.applies(xs[0], 3)  # off for the rest of the process
    monkeypatch.setenv(merge_fused.ENV, "0")
    for f, a in zip(fallen, outputs(module, xs, grad)):
        torch.testing.assert_close(f, a)


@pytest.mark.parametrize("rate", [2**31, 2**32 + 2, 2**33])
def test_rates_past_int32_are_clamped_to_the_same_rows(rate, interpret, launches, monkeypatch):
    """A rate past the segment keeps one row per segment (and in longnet a head step past the heads one head):
    the kernel's int32 arithmetic gets the clamped values, the rows are the same (found by review)."""
    module = ImprovedDilatedAttention([8], [rate])
    _, xs, grad = inputs((1, 16, 2, 8), torch.float32, seed=7)
    combined = outputs(module, xs, grad)
    assert launches == [True] * 4
    monkeypatch.setenv(merge_fused.ENV, "0")
    for c, a in zip(combined, outputs(module, xs, grad)):
        torch.testing.assert_close(c, a, atol=2e-6, rtol=1e-5)


def test_a_nan_lse_stays_nan(interpret, launches):
    """A NaN in a block's lse reaches the merged lse as NaN, not as an empty row's -inf."""
    block = build_blocks(8, 1, [4], [1], "longnet")[0]
    part, part_lse = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1)
    part_lse[0, 1, 0] = float("nan")
    out, lse = torch.empty(1, 8, 1, 8), torch.empty(1, 8, 1)
    combine.merge_into(out, lse, [block], [part], [part_lse])
    assert launches == [True] and lse[0, 1, 0].isnan() and torch.isfinite(lse[0, 2:]).all()


def test_alignment_hint_divides_every_row_stride():
    parts = [torch.empty(4, 8, 2, 64), torch.empty(4, 8, 3, 24)[:, ::2]]
    assert combine._alignment(parts) == 8  # 24 * 3 * 2 (a row), 24 * 3 and 24: 8 divides all
    assert combine._alignment([torch.empty(3, 5, 7)]) == 1


def test_the_path_taken_is_recorded_and_the_planner_can_assume_either(interpret, monkeypatch):
    module = ImprovedDilatedAttention([8, 16], [1, 2])
    _, xs, grad = inputs((1, 32, 4, 8), torch.float32)
    combine.reset_paths()
    outputs(module, xs, grad)
    assert combine.paths_used() == "one-pass"
    monkeypatch.setenv(merge_fused.ENV, "0")
    outputs(module, xs, grad)
    assert combine.paths_used() == "one-pass+accumulating"
    combine.reset_paths()
    assert combine.paths_used() is None
    assert not combine.expected("cuda", torch.bfloat16, 7, 64)  # DATTN_FUSED_MERGE=0
    with combine.assume("one-pass"):
        assert combine.expected("cuda", torch.bfloat16, 7, 64) and not combine.expected("cuda", torch.float64, 7, 64)
        with combine.assume("accumulating"):
            assert not combine.expected("cuda", torch.bfloat16, 7, 64)


@pytest.mark.slow
@pytest.mark.parametrize("merge", [True, False])
def test_kernel_compiles_for_sm90_without_a_device(merge):
    """The compiled (not interpreted) kernel builds down to an sm_90 cubin here, with triton's own ptxas."""
    pytest.importorskip("triton.backends.nvidia")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dattn_cli.kernels.combine_triton import GEO_INTS, build

    kernel, k = build(False), 7
    constexprs = {"K": k, "MERGE": merge, "GEO_INTS": GEO_INTS, "ALIGN": 16, "BLOCK_R": 64, "BLOCK_D": 64}
    types = {"dst": "*bf16", "dlse": "*fp32", "parts": ("*bf16",) * k, "lses": ("*fp32",) * k, "geo": "*i64"}
    for ints in ("i64", "i32"):  # the launcher passes small integers as i32
        signature = {n: "constexpr" if n in constexprs else types.get(n, ints) for n in kernel.arg_names}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"]


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_combined_equals_accumulated(dtype, launches, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(merge_fused.ENV, raising=False)
    module = ImprovedDilatedAttention([128, 256, 512], [1, 2, 4])
    _, xs, grad = inputs((2, 1000, 8, 64), dtype, device="cuda")
    combined = outputs(module, xs, grad)
    assert launches and all(launches)
    monkeypatch.setenv(merge_fused.ENV, "0")
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for c, a in zip(combined, outputs(module, xs, grad)):
        torch.testing.assert_close(c.float(), a.float(), **tol)
