"""The block-local references equal the dense ones (the definitions) on the awkward cases, forward and
gradients: w > N, w % r != 0, causal, head_groups, GQA/MQA, packed documents, key padding, ragged N, chunks
much smaller than a segment; and the naive half computation stays as close to float64 as the dense one."""

import contextlib
import itertools
from unittest import mock

import pytest
import torch

from dattn_cli.kernels import reference_local
from dattn_cli.kernels.documents import offsets
from dattn_cli.kernels.reference import block_sparse_reference, dilated_attention_reference, sliding_window_reference
from dattn_cli.kernels.reference_layouts import Blocks, Budget
from dattn_cli.kernels.reference_local import block_sparse_local, dilated_attention_local, sliding_window_local


def outputs(fn, q, k, v, upstream, *args, given=False, **kw):
    """out, lse, dq, dk, dv; given: the upstream gradient passed to fn beforehand as well, and no chunk recomputed."""
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    recomputing = mock.patch.object(reference_local, "_accumulate", side_effect=AssertionError("recomputed"))
    with recomputing if given else contextlib.nullcontext():
        out, lse = fn(*xs, *args, **kw, **({"upstream": upstream} if given else {}))
        return [out.detach(), lse, *torch.autograd.grad(out, xs, upstream.to(out.dtype))]


def assert_same(a, b, tol=1e-12):
    assert torch.equal(torch.isinf(a[1]), torch.isinf(b[1]))  # uncovered rows: lse -inf in both
    for x, y in zip(a, b):
        finite = torch.isfinite(x)
        assert (x[finite].double() - y[finite].double()).abs().max().item() <= tol


def draw(batch, n, heads, kv_heads, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, n, kv_heads, dim, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, torch.randn(batch, n, heads, dim, generator=g, dtype=torch.float64)


DILATED = [  # (B, N, H, H_kv, segments, rates)
    (2, 50, 4, 4, [16, 32], [1, 2]),  # ragged N
    (1, 24, 4, 2, [8, 64], [1, 4]),  # w > N, GQA
    (1, 45, 3, 3, [10, 15], [3, 4]),  # w % r != 0, no r = 1 (uncovered rows)
    (2, 40, 5, 5, [8, 16, 32], [1, 2, 3]),  # H % m != 0, H % r != 0
    (1, 96, 8, 1, [8, 48, 96], [1, 2, 3]),  # MQA
]


@pytest.mark.parametrize("case", DILATED, ids=lambda c: f"N{c[1]}-H{c[2]}-kv{c[3]}-{c[4]}-{c[5]}")
@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
def test_dilated_local_equals_dense(case, semantics, causal):
    batch, n, heads, kv_heads, segs, rates = case
    if semantics == "head_groups" and heads < len(segs):
        pytest.skip("head_groups needs a head per pair")
    q, k, v, up = draw(batch, n, heads, kv_heads)
    mask = torch.rand(batch, n, generator=torch.Generator().manual_seed(1)) < 0.2
    args = (segs, rates, causal, semantics)
    dense = outputs(dilated_attention_reference, q, k, v, up, *args, key_padding_mask=mask)
    for chunk, given in itertools.product((1 << 22, 100, 7), (False, True)):  # one chunk; many; single rows
        local = outputs(
            dilated_attention_local, q, k, v, up, *args, key_padding_mask=mask, max_chunk_elements=chunk, given=given
        )
        assert_same(dense, local)


@pytest.mark.parametrize("causal", [False, True])
def test_documents_each_attended_on_their_own(causal):
    lengths = [7, 30, 1, 40, 18]
    q, k, v, up = draw(1, sum(lengths), 4, 2)
    cu = offsets(lengths)
    dense = [[], [], [], [], []]
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):  # the definition: one call per document
        part = outputs(
            dilated_attention_reference, q[:, a:b], k[:, a:b], v[:, a:b], up[:, a:b], [8, 16, 64], [1, 2, 4], causal
        )
        for i, x in enumerate(part):
            dense[i].append(x)
    dense = [torch.cat(x, 1) for x in dense]
    local = outputs(
        dilated_attention_local, q, k, v, up, [8, 16, 64], [1, 2, 4], causal, cu_seqlens=cu, max_chunk_elements=64
    )
    assert_same(dense, local)


@pytest.mark.parametrize("n, block", [(50, 8), (64, 8), (33, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_table_and_window_local_equal_dense(n, block, causal):
    blocks = -(-n // block)
    table = torch.rand(blocks, blocks, generator=torch.Generator().manual_seed(n)) < 0.4
    table[0] = False  # a query block with no key block: rows output 0
    q, k, v, up = draw(1, n, 4, 2)
    mask = torch.zeros(1, n, dtype=torch.bool)
    mask[0, 3] = True
    for chunk, given in [(1 << 22, False), (50, False), (1 << 22, True), (50, True)]:  # given: no recomputation
        dense = outputs(block_sparse_reference, q, k, v, up, table, block, causal, key_padding_mask=mask)
        local = outputs(
            block_sparse_local,
            *(q, k, v, up, table, block, causal),
            key_padding_mask=mask,
            max_chunk_elements=chunk,
            given=given,
        )
        assert_same(dense, local)
        for left, right in [(13, 5), (0, 0), (100, 3)]:  # uneven, the diagonal alone, wider than N
            dense = outputs(sliding_window_reference, q, k, v, up, left, right, causal)
            local = outputs(
                sliding_window_local, q, k, v, up, left, right, causal, max_chunk_elements=chunk, given=given
            )
            assert_same(dense, local)


def test_the_naive_bfloat16_computation_is_as_close_to_float64_as_the_dense_one():
    q, k, v, up = draw(1, 256, 4, 4, dim=32)
    args = ([64, 128], [1, 2])
    ref = outputs(dilated_attention_reference, q, k, v, up, *args)
    half = [x.bfloat16() for x in (q, k, v, up)]
    dense = outputs(dilated_attention_reference, *half, *args, compute_dtype=torch.bfloat16)
    local = outputs(dilated_attention_local, *half, *args, compute_dtype=torch.bfloat16, max_chunk_elements=4096)
    for d, lo, r in zip(dense, local, ref):
        scale = r.abs().max().item()
        dense_err = (d.double() - r).abs().max().item() / scale
        local_err = (lo.double() - r).abs().max().item() / scale
        assert 0 < local_err <= 3 * dense_err + 1e-3, (local_err, dense_err)  # bf16-sized, not float64-sized


def test_the_local_reference_holds_one_chunk_not_the_scores():
    """At N = 4096 the dense reference saves 2 x B x H x N^2 float64 scores (1 GiB here); the local one a chunk."""
    q, k, v, up = draw(1, 4096, 4, 4, dim=8)
    xs = [x.requires_grad_() for x in (q, k, v)]
    from torch.autograd.graph import saved_tensors_hooks

    saved = []
    with saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
        out, _ = dilated_attention_local(*xs, [512, 1024], [1, 2])
    assert sum(saved) <= 8 * q.numel() * 8  # q, k, v, out, lse: O(N x H x D)
    torch.autograd.grad(out, xs, up)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_local_reference_on_a_gpu_equals_the_cpu_one():
    q, k, v, up = draw(1, 300, 8, 2)
    args = ([64, 128, 256], [1, 2, 4], True)
    cpu = outputs(dilated_attention_local, q, k, v, up, *args, max_chunk_elements=1 << 12)
    gpu = outputs(dilated_attention_local, *(x.cuda() for x in (q, k, v, up)), *args, max_chunk_elements=1 << 12)
    assert_same(cpu, [x.cpu() for x in gpu])


@pytest.mark.parametrize("causal", [False, True])
def test_a_chunk_whose_rows_attend_all_its_keys_equals_dense(causal):
    """Segment-like tables: a chunk of query blocks that attend every one of its key blocks takes no mask."""
    table = torch.kron(torch.eye(4), torch.ones(2, 2)).bool()  # 8 blocks of 8 tokens, pairs of blocks together
    q, k, v, up = draw(1, 64, 4, 2)
    dense = outputs(block_sparse_reference, q, k, v, up, table, 8, causal)
    for chunk in (1 << 22, 128, 32):  # one chunk (masked), one block per chunk (whole), part of one block
        assert_same(dense, outputs(block_sparse_local, q, k, v, up, table, 8, causal, max_chunk_elements=chunk))


@pytest.mark.parametrize("causal", [False, True])
def test_head_slices_of_a_batch_accumulate_their_key_shares_out_of_place(monkeypatch, causal):
    """B > 1 with parts of 2 of a row class's 3 heads: the dK/dV share slices do not flatten to one batch, and
    _add_product's out-of-place sum must give the dense gradients too (GQA on top)."""
    flattened = []
    add_product = reference_local._add_product

    def spy(target, a, b):
        try:
            target.view(-1, *target.shape[2:])
            flattened.append(True)
        except RuntimeError:
            flattened.append(False)
        add_product(target, a, b)

    monkeypatch.setattr(reference_local, "_add_product", spy)
    q, k, v, up = draw(3, 60, 6, 2)
    args = ([20, 60], [1, 2], causal, "longnet")  # rate 2: 3 heads per offset
    dense = outputs(dilated_attention_reference, q, k, v, up, *args)
    # classes of 10 rows: against 40 keys in parts of 2 heads (3 x 2 x 10 x 40 <= 3000), against 20 all 3 at once
    local = outputs(dilated_attention_local, q, k, v, up, *args, max_chunk_elements=3000)
    assert_same(dense, local)
    assert not all(flattened) and any(flattened)


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_with_like_rows_share_a_chunk_and_equal_dense(causal):
    """A dilated-like table repeats each row every other block: those blocks are one chunk (their keys gathered
    once), its rows not one range; ragged N, GQA and key padding on top."""
    n, block = 60, 8  # 8 blocks, the last one part
    parity = torch.arange(8) % 2
    table = parity.view(-1, 1) == parity.view(1, -1)
    table[:, 0] = True
    q, k, v, up = draw(2, n, 4, 2)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, -5:] = True
    dense = outputs(block_sparse_reference, q, k, v, up, table, block, causal, key_padding_mask=mask)
    for chunk in (1 << 22, 2 * 4 * 40, 2 * 4 * 8):  # whole groups, parts of a group, parts of fewer heads
        for given in (False, True):
            got = outputs(
                block_sparse_local,
                *(q, k, v, up, table, block, causal),
                key_padding_mask=mask,
                max_chunk_elements=chunk,
                given=given,
            )
            assert_same(dense, got)
    one_block = Budget(2, 4, 2 * 4 * 40 * block)  # budget for one block's rows against the widest row's 40 keys
    layout = Blocks(n, table, block, causal, one_block, q.device)
    assert [g.tolist() for g in layout.groups()] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_a_given_upstream_gradient_is_used_once_and_only_for_itself(monkeypatch):
    """With the upstream gradient given, the gradients are computed in the forward pass (no recomputing
    backward runs), the dilated layout's too; a backward with another gradient recomputes and is right for
    that one."""
    import dattn_cli.kernels.reference_local as local

    q, k, v, up = draw(2, 40, 4, 2)
    table = torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) < 0.5
    other = torch.randn(up.shape, generator=torch.Generator().manual_seed(4), dtype=up.dtype)
    dense = outputs(block_sparse_reference, q, k, v, other, table, 8, True)
    recomputing = []
    real = local._accumulate
    monkeypatch.setattr(local, "_accumulate", lambda *a: recomputing.append(1) or real(*a))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = block_sparse_local(*xs, table, 8, True, upstream=up, max_chunk_elements=64)
    first = torch.autograd.grad(out, xs, up, retain_graph=True)
    assert not recomputing
    grads = torch.autograd.grad(out, xs, other, retain_graph=True)  # not the given gradient: recomputed, and right
    assert recomputing
    assert_same(dense, [out.detach(), dense[1], *grads])
    recomputing.clear()
    again = torch.autograd.grad(out, xs, up)  # the given gradient once more: recomputed (the first were handed out)
    assert recomputing and all((a - b).abs().max() < 1e-12 for a, b in zip(first, again))
    recomputing.clear()
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = dilated_attention_local(*xs, [8, 16], [1, 2], upstream=up)
    given = torch.autograd.grad(out, xs, up)
    assert not recomputing
    assert_same(outputs(dilated_attention_reference, q, k, v, up, [8, 16], [1, 2]), [out.detach(), lse, *given])


def test_the_naive_bfloat16_computation_with_its_gradient_given_stays_bfloat16_sized():
    q, k, v, up = draw(1, 256, 4, 2, dim=32)
    table = torch.kron(torch.eye(4), torch.ones(2, 2)).bool() | torch.eye(8).roll(1, 1).bool()
    ref = outputs(block_sparse_reference, q, k, v, up, table, 32)
    half = [x.bfloat16() for x in (q, k, v, up)]
    recomputed = outputs(block_sparse_local, *half, table, 32, compute_dtype=torch.bfloat16, max_chunk_elements=4096)
    given = outputs(
        block_sparse_local, *half, table, 32, compute_dtype=torch.bfloat16, max_chunk_elements=4096, given=True
    )
    for a, b, r in zip(recomputed, given, ref):
        scale = r.abs().max().item()
        errors = [(x.double() - r).abs().max().item() / scale for x in (a, b)]
        assert 0 < errors[1] <= 3 * errors[0] + 1e-3, errors


@pytest.mark.parametrize(
    "segs, rates", [([8] * 41, [1] * 41), ([8 + i for i in range(41)], [1 + i % 3 for i in range(41)])]
)
def test_many_pairs_classify_rows_without_overflow(segs, rates):
    """41 pairs: a class number built from one digit per pair would pass 2^63 (3^41); renumbered, it does not."""
    q, k, v, up = draw(1, 8, 2, 1, dim=4)
    dense = outputs(dilated_attention_reference, q, k, v, up, segs, rates)
    assert_same(dense, outputs(dilated_attention_local, q, k, v, up, segs, rates))


@pytest.mark.parametrize("causal", [False, True])
def test_a_row_wise_upstream_gradient_gives_the_reference_gradients_without_recomputing(causal):
    """upstream as a function of the rows' output: the same out, lse and gradients as the dense reference
    backpropagating what the function gives of the whole output, with no chunk recomputed. The function mixes
    every head of a row (as a sub-LayerNorm does), so each part holds all of them; the budget (64 scores) would
    otherwise split the heads."""
    q, k, v, up = draw(2, 40, 4, 2)
    table = torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) < 0.6
    weight = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)

    def row_wise(rows, out):
        return up[:, rows] * weight + out.sum(dim=(2, 3), keepdim=True)

    patterns = (
        (block_sparse_local, block_sparse_reference, (table, 8)),
        (sliding_window_local, sliding_window_reference, (5, 3)),
    )
    for local, dense, args in patterns:
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        with mock.patch.object(reference_local, "_accumulate", side_effect=AssertionError("recomputed")):
            out, lse = local(*xs, *args, causal, upstream=row_wise, max_chunk_elements=64)
            expected = row_wise(slice(None), out.detach())
            got = [out.detach(), lse, *torch.autograd.grad(out, xs, expected)]
        assert_same(outputs(dense, q, k, v, expected, *args, causal), got)
