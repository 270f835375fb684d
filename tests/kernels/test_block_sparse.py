"""BlockSparseRingDilatedAttention against the dense reference with its block table: forward, lse and
gradients for every pattern, causal or not, ragged N, key padding; empty rows give 0; FlexAttention's
BlockMask encodes the same table; the plan gathers only active key blocks; on one device the single-device
executor (local.py) runs it and nothing travels."""

import itertools

import pytest
import torch

from dattn_cli.kernels import (
    BlockSparseRingDilatedAttention,
    BlockSparseRingMultiheadDilatedAttention,
    block_sparse_reference,
    get_global_pattern_cache,
)
from dattn_cli.kernels.block_sparse.flex import flex_block_mask, flex_compiles_on, flex_forward
from dattn_cli.kernels.block_sparse.local import plan_local
from dattn_cli.kernels.block_sparse.patterns import TABLE_PATTERNS
from dattn_cli.kernels.block_sparse.ring import plan_rank
from tests.conftest import rel_err


def make(pattern: str, block_size: int = 8, **kwargs) -> BlockSparseRingDilatedAttention:
    if pattern in ("dilated", "longnet"):
        kwargs = {"segment_lengths": [16, 32], "dilation_rates": [1, 2], **kwargs}
    elif "density" not in kwargs:
        kwargs = {"window": 1, **kwargs}
    return BlockSparseRingDilatedAttention(pattern=pattern, block_size=block_size, **kwargs)


@pytest.mark.parametrize(
    "pattern,causal,seq_len,masked", list(itertools.product(TABLE_PATTERNS, [False, True], [64, 50], [False, True]))
)
def test_forward_and_gradients_equal_the_block_masked_reference(pattern, causal, seq_len, masked):
    torch.manual_seed(hash((pattern, causal, seq_len, masked)) % 1000)
    module = make(pattern)
    B, H, D = 2, 3, 8
    base = [torch.randn(B, seq_len, H, D, dtype=torch.float64) for _ in range(4)]
    mask = (torch.rand(B, seq_len) < 0.3) if masked else None
    xs = [x.float().requires_grad_() for x in base[:3]]
    out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=mask)
    grads = torch.autograd.grad(out, xs, base[3].float())
    refs = [x.clone().requires_grad_() for x in base[:3]]
    ref, ref_lse = block_sparse_reference(*refs, module.block_table(seq_len, H), 8, causal, key_padding_mask=mask)
    ref_grads = torch.autograd.grad(ref, refs, base[3])
    assert out.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-5 and rel_err(lse, ref_lse) <= 1e-5
    for got, want in zip(grads, ref_grads):
        assert rel_err(got, want) <= 1e-4


def test_rows_with_no_active_block_are_zero_not_nan():
    module = make("dilated", segment_lengths=[16], dilation_rates=[1])
    q = torch.randn(1, 40, 2, 8, requires_grad=True)
    mask = torch.zeros(1, 40, dtype=torch.bool)
    mask[:, :16] = True  # every key of the first segment is padding: its queries have no key at all
    out, lse = module.forward_with_lse(q, q, q, key_padding_mask=mask)
    out.sum().backward()
    assert torch.equal(out[:, :16], torch.zeros_like(out[:, :16])) and torch.isneginf(lse[:, :16]).all()
    assert torch.isfinite(q.grad).all()


def test_density_reports_blocks_and_elements():
    module = make("local", block_size=128, density=0.1)
    q = torch.randn(1, 32768 // 8, 1, 8)
    module(q, q, q)
    table = module.block_table(4096, 1)
    assert module.density() == table.float().mean().item()
    assert 0.08 < module.density() < 0.12
    assert module.element_density() == pytest.approx(module.attended_pairs(4096, 1) / 4096**2)
    assert module.element_density(is_causal=True) < 0.6 * module.element_density()
    assert "density" in module.describe() and "gather" in module.describe()


def test_gather_plan_uses_slices_for_contiguous_blocks_and_only_active_rows():
    table = make("dilated", segment_lengths=[64], dilation_rates=[2]).block_table(64, 1)
    parts = plan_local(table, 64, 8, False, torch.device("cpu"))
    for part in parts:
        keys = torch.arange(64)[part.keys] if isinstance(part.keys, slice) else part.keys
        q_block = part.queries.start // 8
        assert set((keys // 8).tolist()) == set(table[q_block].nonzero().flatten().tolist())
    assert {p.queries.start // 8 for p in parts} == set(range(8))  # every query block has some key block
    local = plan_local(make("local").block_table(64, 1), 64, 8, False, torch.device("cpu"))
    assert all(isinstance(p.keys, slice) for p in local)


@pytest.mark.parametrize("causal", [False, True])
def test_one_device_runs_the_ring_form_calls_of_one_rank_and_moves_nothing(causal):
    table = make("hierarchical").block_table(50, 1)
    ring = plan_rank(table, 50, 8, 0, 1, causal, torch.device("cpu"))
    local = plan_local(table, 50, 8, causal, torch.device("cpu"))
    assert not ring.remote and not ring.send
    assert [(p.queries, str(p.keys), p.causal, p.stream) for p in local] == [
        (p.queries, str(p.keys), p.causal, p.stream) for p in ring.local
    ]
    module = make("hierarchical", executor="gather")
    q = torch.randn(1, 50, 2, 8, requires_grad=True)
    module(q, q, q, causal).sum().backward()
    assert module.received_blocks() == {} and not any(module.comm_stats().values())


def test_block_table_and_plan_are_cached_with_their_bytes():
    cache = get_global_pattern_cache()
    module = make("local", block_size=8)
    q = torch.randn(1, 64, 2, 8)
    before = cache.stats()
    module(q, q, q)
    module(q, q, q)
    after = cache.stats()
    assert after["hits"] > before["hits"] and after["bytes"] > before["bytes"]


def test_multihead_form_matches_its_reference_core():
    torch.manual_seed(0)
    mha = BlockSparseRingMultiheadDilatedAttention(
        32, 4, pattern="global_local", block_size=8, window=1, dtype=torch.float64
    )
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    out, none = mha(x, x, x, is_causal=True)
    qkv = mha.in_proj(x).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (4, 8)) for t in qkv)
    ref = mha.attention.reference(q, k, v, True)[0].flatten(2)
    assert none is None and rel_err(out, mha.out_proj(mha.norm(ref))) <= 1e-10


def test_bad_configuration_raises_one_clear_error():
    with pytest.raises(ValueError, match="needs segment_lengths and dilation_rates"):
        BlockSparseRingDilatedAttention(pattern="dilated")
    with pytest.raises(ValueError, match="executor='fast' is unknown"):
        make("local", executor="fast")
    with pytest.raises(ValueError, match="only applies to pattern='longnet'"):
        make("local", semantics="head_groups")
    with pytest.raises(TypeError):
        BlockSparseRingMultiheadDilatedAttention(16, 2, pattern="local", windw=2)
    q = torch.randn(1, 16, 2, 8, requires_grad=True)
    with pytest.raises(ValueError, match="executor='flex' cannot run this call: .*CPU for inference only"):
        make("local", executor="flex")(q, q, q)


# FlexAttention ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "pattern,causal,seq_len", list(itertools.product(["local", "dilated", "longnet"], [False, True], [64, 50]))
)
def test_flex_block_mask_encodes_the_table(pattern, causal, seq_len):
    """Eager FlexAttention (its dense math) with the BlockMask equals the block-masked reference, lse and
    fully masked query blocks included: the same BlockMask the compiled CUDA kernel receives."""
    torch.manual_seed(1)
    module = make(pattern, block_size=16)
    table = module.block_table(seq_len, 3).clone()
    table[1, :] = False  # a query block with no key block
    q, k, v = (torch.randn(2, seq_len, 3, 16) for _ in range(3))
    mask = flex_block_mask(table, seq_len, 16, causal, torch.device("cpu"))
    out, lse = flex_forward(q, k, v, mask, 0.25, need_lse=True, compiled=False)
    ref, ref_lse = block_sparse_reference(q, k, v, table, 16, causal)
    assert rel_err(out, ref) <= 1e-5 and rel_err(lse, ref_lse) <= 1e-5
    assert torch.equal(out[:, 16:32], torch.zeros_like(out[:, 16:32]))


@pytest.mark.slow
@pytest.mark.skipif(not flex_compiles_on("cpu"), reason="no C++ compiler for torch.compile on CPU")
def test_compiled_flex_forward_on_cpu_equals_the_reference():
    torch.manual_seed(2)
    module = make("hierarchical", block_size=16, executor="flex")
    q, k, v = (torch.randn(1, 80, 2, 16) for _ in range(3))
    with torch.no_grad():
        out = module(q, k, v, is_causal=True)
    assert module.last_executor[0] == "flex"
    ref, _ = module.reference(q, k, v, True)
    assert rel_err(out, ref) <= 1e-5


def test_query_blocks_with_one_key_set_run_as_one_call_except_under_dropout():
    from dattn_cli.kernels.block_sparse.gather import coalesce
    from dattn_cli.kernels.block_sparse.local import LocalBlocks

    table = torch.zeros(8, 8, dtype=torch.bool)
    table[:4, :4] = table[4:, 4:] = True  # two segments of four blocks, dense inside
    parts = plan_local(table, 8 * 16, 16, False, torch.device("cpu"))
    assert len(parts) == 8
    merged = coalesce(parts)
    assert [(p.queries, p.keys) for p in merged] == [(slice(0, 64), slice(0, 64)), (slice(64, 128), slice(64, 128))]
    assert len(coalesce(parts, max_rows=32)) == 4
    assert len(coalesce(plan_local(table, 8 * 16, 16, True, torch.device("cpu")))) > 2  # causal diagonals stay apart
    table[::2, 1::2] = False  # a dilated-like table: the key sets alternate; index keys of one set are shared
    index_parts = plan_local(table, 8 * 16, 16, False, torch.device("cpu"))
    assert index_parts[0].keys is index_parts[2].keys and len(coalesce(index_parts)) == 8
    executor = LocalBlocks(parts)

    class Call:
        def __init__(self, p):
            self.call = type("C", (), {"dropout_p": p})()

    assert executor.calls(Call(0.0)) == merged and executor.calls(Call(0.1)) == parts
