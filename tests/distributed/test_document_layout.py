"""layout="documents" (kernels/distributed/document_layout.py): packed documents balanced across ranks. On gloo
ranks (p = 2 and 4) the ring and all-gather classes equal a separate call on each document, forward and
gradients; gather_sequence with the layout restores the order; the layout's pairs per rank are balanced."""

import pytest
import torch

from dattn_cli.kernels import document_layout
from dattn_cli.kernels.distributed.document_layout import rank_pairs
from dattn_cli.kernels.distributed.sharding import join_shards, rank_shard
from dattn_cli.kernels.documents import offsets
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import document_layout_workers as dw, gqa_workers as w
from tests.distributed.test_documents import _separate_calls


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_balanced_documents_equal_separate_calls(world):
    per_rank = run_distributed(dw.balanced_cases, world, timeout_s=180)
    for key in per_rank[0]:
        impl, case, causal, masked = key
        lengths = w.DOC_LENGTHS[case]
        layout = document_layout(offsets(lengths), world, w.SEGS)
        assert layout.spread, "some document is spread over the ranks: the ring really runs"
        out, lse, grads = _separate_calls(impl, case, causal, masked)
        join = lambda name, j=None: join_shards(  # noqa: E731
            [r[key][name] if j is None else r[key][name][j] for r in per_rank], sum(lengths), layout=layout
        )
        where = (impl, world, key)
        assert rel_err(join("out"), out) <= 1e-10 and rel_err(join("lse"), lse.double()) <= 1e-6, where
        for j in range(3):
            assert rel_err(join("grads", j), grads[j]) <= 1e-10, (where, j)
        for r in per_rank:
            assert torch.equal(r[key]["gathered"], join("out")), where
            assert r[key]["comm"]["forward_bytes_sent"] > 0, where


def test_layout_is_a_permutation_that_join_inverts_and_balances_pairs():
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.randn(60, generator=g) + 5).long().clamp(min=1).tolist()
    cu = offsets(lengths)
    x = torch.randn(1, sum(lengths), 2, generator=g)
    for world in (2, 4, 8):
        layout = document_layout(cu, world)
        held = layout.positions[layout.positions >= 0]
        assert torch.equal(held.sort().values, torch.arange(sum(lengths)))
        shards = [rank_shard(x, r, world, layout.shard_len, layout=layout)[0] for r in range(world)]
        assert torch.equal(join_shards(shards, sum(lengths), layout=layout), x)
        work = rank_pairs(layout.positions, cu).double()
        assert work.max() / work.mean() <= 1.10, (world, work)


def test_documents_layout_needs_cu_seqlens_and_its_own_shards():
    from dattn_cli.kernels import REGISTRY

    module = REGISTRY["RingDilatedAttention"].cls([8], [1], layout="documents")
    x = torch.zeros(1, 8, 2, 4)
    with pytest.raises(ValueError, match=r"layout='documents' needs the packed documents: pass cu_seqlens"):
        module._distributed(x, x, x, False, None, None, False, 0, 2)
    with pytest.raises(ValueError, match=r"shard shape \(1, 8\) is not \(1, 21\)"):
        module._distributed(x, x, x, False, None, offsets([3, 4, 17]), False, 0, 2)


def test_rotary_under_the_documents_layout_is_refused_in_one_line():
    from types import SimpleNamespace

    from dattn_cli.kernels.multihead import shard_positions

    with pytest.raises(ValueError, match=r"rotary embeddings are not supported with layout='documents'"):
        shard_positions(SimpleNamespace(process_group=None, layout="documents"), 8, "cpu")
