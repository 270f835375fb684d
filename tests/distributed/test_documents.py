"""Packed documents (cu_seqlens) on every distributed form, gloo, p = 2 and 4: documents crossing 2 and 4 shards
give the same output and gradients as a separate call on each document (the dense reference per document)."""

import pytest
import torch

from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import gqa_workers as w
from tests.distributed.test_gqa import IMPLS


def _separate_calls(impl: str, case: int, causal: bool, masked: bool):
    """Each document through the single-process module's dense reference on its own."""
    q, k, v, up, mask = w.doc_inputs(case, masked)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    module, outs, lses, at = w.module_for(impl), [], [], 0
    for n in w.DOC_LENGTHS[case]:
        rows = slice(at, at + n)
        out, lse = module.reference(
            q[:, rows], k[:, rows], v[:, rows], causal, key_padding_mask=None if mask is None else mask[:, rows]
        )
        outs.append(out)
        lses.append(lse)
        at += n
    out = torch.cat(outs, 1)
    return out, torch.cat(lses, 1), torch.autograd.grad(out, (q, k, v), up)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("impl", IMPLS)
def test_documents_across_shards_equal_separate_calls(impl, world):
    per_rank = run_distributed(w.document_cases, world, impl, timeout_s=180)
    for key in per_rank[0]:
        out, lse, grads = _separate_calls(impl, *key)
        join = lambda name, j=None: torch.cat(
            [
                r[key][name] if j is None else r[key][name][j]  # noqa: E731
                for r in per_rank
            ],
            1,
        )
        where = (impl, world, key)
        assert rel_err(join("out"), out) <= 1e-10 and rel_err(join("lse"), lse.double()) <= 1e-6, where
        for j in range(3):
            assert rel_err(join("grads", j), grads[j]) <= 1e-10, (where, j)
        if not impl.startswith("HeadParallel"):  # rows of documents crossing shards are gathered, no others
            rows = _gathered_rows(w.DOC_LENGTHS[key[0]], world)
            qkv = (world - 1) * rows * (w.DOC_HEADS + 2 * w.DOC_KV_HEADS) * w.D * 8  # B = 1, float64
            mask = (world - 1) * rows if key[2] else 0
            for r in per_rank:
                comm = r[key]["comm"]
                assert (comm["forward_bytes_sent"], comm["backward_bytes_sent"]) == (qkv + mask, qkv), where


def _gathered_rows(lengths: list[int], world: int) -> int:
    """P: the most rows of crossing documents one rank holds (every rank's piece is padded to it)."""
    shard, at, held = sum(lengths) // world, 0, [0] * world
    for n in lengths:
        first, last = at // shard, (at + n - 1) // shard
        for s in range(first, last + 1) if last > first else ():
            held[s] += min(at + n, (s + 1) * shard) - max(at, s * shard)
        at += n
    return max(held)


def test_changing_documents_are_checked_not_remembered_and_one_document_is_the_plain_call():
    """Every call's cu_seqlens is checked across ranks, but not kept (batches change their boundaries: a remembered
    set would grow without end); cu_seqlens = [0, T] runs the pattern's own sequence parallelism."""
    for r in run_distributed(w.document_bookkeeping, 2, timeout_s=120):
        assert r["keys"] == 1 and r["same"] and r["whole"] == r["plain"], r
