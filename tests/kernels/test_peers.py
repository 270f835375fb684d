"""Peers (kernels/peers.py): FlexAttention with the dilated pattern computes dattn's function exactly (score_mod
+ log c), its mask variant another one; the external peers say why they cannot run."""

import sys

import pytest
import torch

from dattn_cli.kernels.heads import expand_kv
from dattn_cli.kernels.peers import (
    FlexDilatedAttention,
    FlexDilatedMaskAttention,
    dilated_block_mask,
    import_problem,
    installed_project,
    mask_block_size,
    pair_multiplicity,
)
from dattn_cli.kernels.reference import dilated_attention_reference
from dattn_cli.kernels.registry import REGISTRY

CASES = [  # n, segments, rates, semantics, causal, heads, kv heads: ragged N, w > N, w % r != 0, GQA
    (256, [64, 128], [1, 2], "longnet", False, 3, 3),
    (200, [64, 128], [1, 2], "longnet", True, 2, 2),
    (192, [256, 96], [3, 2], "longnet", True, 4, 2),
    (256, [64, 128, 256], [1, 2, 4], "head_groups", False, 5, 5),
]


def brute_multiplicity(n, heads, segments, rates, semantics):
    """c[h, t, u] by the words of docs/semantics.md, one position at a time."""
    m = len(segments)
    sizes = [heads // m + (1 if i < heads % m else 0) for i in range(m)]
    c = torch.zeros(heads, n, n, dtype=torch.int64)
    for h in range(heads):
        for i, (w, r) in enumerate(zip(segments, rates)):
            w = min(w, n)
            if semantics == "head_groups":
                if not sum(sizes[:i]) <= h < sum(sizes[: i + 1]):
                    continue
                offset = i % r
            else:
                offset = h % r
            kept = [t for t in range(n) if (t % w) % r == offset]
            for t in kept:
                for u in kept:
                    c[h, t, u] += t // w == u // w
    return c


@pytest.mark.parametrize("n, segments, rates, semantics, causal, heads, kv_heads", CASES)
def test_flex_score_mod_is_dattns_function(n, segments, rates, semantics, causal, heads, kv_heads):
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(1, n, heads, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, n, kv_heads, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    out = FlexDilatedAttention(segments, rates, semantics=semantics)(q, k, v, is_causal=causal)
    ref = dilated_attention_reference(q, *expand_kv(k, v, heads), segments, rates, causal, semantics)[0]
    assert (out - ref).abs().max() <= 1e-12 * ref.abs().max()


def test_the_boolean_mask_is_another_function_where_pairs_overlap():
    n, segments, rates = 256, [64, 128], [1, 2]
    q, k, v = (torch.randn(1, n, 2, 16, dtype=torch.float64) for _ in range(3))
    ref = dilated_attention_reference(q, k, v, segments, rates, False, "longnet")[0]
    masked = FlexDilatedMaskAttention(segments, rates)(q, k, v)
    assert (masked - ref).abs().max() > 1e-3  # keys offered by two pairs counted once, not twice
    assert "ANOTHER function" in REGISTRY["flex_dilated_mask"].summary


@pytest.mark.parametrize("n, segments, rates, semantics, causal, heads, kv_heads", CASES)
def test_multiplicity_and_block_mask_against_the_words_of_the_definition(
    n, segments, rates, semantics, causal, heads, kv_heads
):
    expected = brute_multiplicity(n, heads, segments, rates, semantics)
    h, t, u = torch.meshgrid(torch.arange(heads), torch.arange(n), torch.arange(n), indexing="ij")
    assert torch.equal(pair_multiplicity(n, heads, segments, rates, semantics)(h, t, u), expected)
    if causal:
        expected = expected * (u <= t)
    mask = dilated_block_mask(n, segments, causal, lambda b, h, q, kv: q >= 0, "cpu")
    visited = mask.to_dense()[0, 0].repeat_interleave(mask.BLOCK_SIZE[0], 0).repeat_interleave(mask.BLOCK_SIZE[1], 1)
    assert visited[:n, :n].bool()[expected.sum(0) > 0].all()  # every attended pair lies in a visited block


@pytest.mark.parametrize("causal", [False, True])
def test_the_block_mask_skips_the_blocks_no_segment_reaches(causal):
    mask = dilated_block_mask(512, [128, 256], causal, lambda b, h, q, kv: q >= 0, "cpu")
    table = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    assert torch.equal(mask.to_dense()[0, 0].cpu(), table.tril() if causal else table)


def test_mask_blocks_grow_so_that_the_table_stays_small():
    assert mask_block_size(4096) == 128
    assert mask_block_size(8 * 2**20) == 1024
    assert -(-(8 * 2**20) // mask_block_size(8 * 2**20)) <= 8192


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward runs on CUDA only")
def test_flex_gradients_on_cuda():
    n, segments, rates = 1024, [256, 512], [1, 2]
    x = [torch.randn(1, n, 4, 64, device="cuda", dtype=torch.float32, requires_grad=True) for _ in range(3)]
    out = FlexDilatedAttention(segments, rates)(*x, is_causal=True)
    ref = dilated_attention_reference(*x, segments, rates, True, "longnet")[0]
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, x, g), torch.autograd.grad(ref.to(out.dtype), x, g)):
        assert (a - b).abs().max() <= 1e-3 * b.abs().max()


def test_external_peers_say_why_they_cannot_run(monkeypatch, tmp_path):
    package = tmp_path / "dilated_attention_pytorch"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "dilated_attention.py").write_text("import xformers_that_is_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_problem.cache_clear()
    try:
        assert installed_project() == "fkodom"
        reason = import_problem("fkodom")
        assert "does not import on torch" in reason and "xformers_that_is_not_here" in reason
        assert "fkodom's" in import_problem("seed")  # the other project holds the one import name
        (package / "core").mkdir()
        import_problem.cache_clear()
        assert installed_project() == "seed" and "the seed project's" in import_problem("fkodom")
    finally:
        import_problem.cache_clear()
        sys.modules.pop("dilated_attention_pytorch", None)


@pytest.mark.parametrize("name", ["fkodom", "seed"])
def test_external_peers_run_only_at_head_groups(name):
    with pytest.raises(ValueError, match="--semantics head_groups"):
        REGISTRY[name].cls([64], [1], semantics="longnet")
