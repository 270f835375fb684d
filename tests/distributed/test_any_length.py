"""Any N over any p: every distributed class on shards from shard_sequence (N = 50, not divisible by p = 2, 3,
4, segments [8, 20] that neither divide nor are multiples of N/p) equals the float64 dense reference on the
real N, forward and gradients, with and without a user key padding mask, causal or not; padded rows hold no
NaN and give real positions nothing; bytes moved equal the formulas on the padded length."""

import pytest
import torch

from dattn_cli.kernels import (
    BlockSparseRingDilatedAttention,
    block_sparse_reference,
    dilated_attention_reference,
    padded_length,
)
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume
from dattn_cli.kernels.distributed.sharding import join_shards
from dattn_cli.runtime.launch import run_distributed
from dattn_cli.verify.outputs import ReferenceCore
from tests.conftest import rel_err
from tests.distributed import sharding_workers as sw

WORLDS = [2, 3, 4]
STRATEGY = {"RingDilatedAttention": "ring", "DistributedImprovedDilatedAttention": "allgather"}


def _check_against(per_rank, key, n, ref, ref_lse, ref_grads, where):
    """The ranks' padded shards, joined and cut to n, equal the reference; the padding rows are finite and
    their gradients zero (a NaN there would reach real gradients: NaN * 0 is NaN)."""
    rows = [r[key] for r in per_rank]
    out = join_shards([r["out"] for r in rows], n)
    assert rel_err(out, ref) <= 1e-5, where
    assert rel_err(join_shards([r["lse"] for r in rows], n), ref_lse) <= 1e-5, where
    for j in range(3):
        grad = join_shards([r["grads"][j] for r in rows], n)
        assert rel_err(grad, ref_grads[j]) <= 1e-4, (where, j)
        padded = torch.cat([r["grads"][j] for r in rows], 1)[:, n:]
        assert torch.equal(padded, torch.zeros_like(padded)), (where, j)
    assert all(torch.isfinite(r["out"]).all() for r in rows), where
    for r in rows:  # gather_sequence gave every rank the same whole sequence
        assert torch.equal(r["gathered"], out.float()), where


def _head_parallel_bytes(world, heads, masked):
    length = -(-sw.N // world)
    per_tensor = sw.B * length * heads * sw.D * 4 * (world - 1) // world
    mask = sw.B * length * (world - 1) if masked or world * length > sw.N else 0  # the (B, L) bool mask gathered
    lse = sw.B * length * heads * 4 * (world - 1) // world  # forward_with_lse brings lse back too
    return dict(
        forward_bytes_sent=4 * per_tensor + mask + lse,
        forward_bytes_received=4 * per_tensor + mask + lse,
        backward_bytes_sent=4 * per_tensor,
        backward_bytes_received=4 * per_tensor,
    )


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_core_classes_are_exact_on_padded_shards(world):
    per_rank = run_distributed(sw.padded_core_cases, world, timeout_s=300)
    heads = sw.heads_for(world)
    for impl in sw.CORE_IMPLS:
        for c, (segments, rates) in enumerate(sw.PATTERNS):
            for i, (sem, causal, masked) in enumerate(sw.PADDED_VARIANTS):
                q, k, v, up, mask = sw.full_inputs(100 * i + 10 * c + world, sw.N, heads, masked)
                q, k, v = (x.requires_grad_() for x in (q, k, v))
                ref, ref_lse = dilated_attention_reference(q, k, v, segments, rates, causal, sem, key_padding_mask=mask)
                ref_grads = torch.autograd.grad(ref, (q, k, v), up)
                where = (impl, world, segments, sem, causal, masked)
                _check_against(per_rank, (impl, c, i), sw.N, ref, ref_lse, ref_grads, where)
                _check_bytes(per_rank, (impl, c, i), world, heads, segments, rates, where)


def _check_bytes(per_rank, key, world, heads, segments, rates, where):
    """Each rank's bytes equal the formula on the padded length, the padding mask included."""
    impl, c, i = key
    sem, causal, masked = sw.PADDED_VARIANTS[i]
    if impl in STRATEGY:
        padded = padded_length(sw.N, world, segments)
        assert padded > sw.N and padded % world == 0
        expected = comm_volume(
            STRATEGY[impl], padded, world, sw.B, heads, sw.D, 4, segments, rates, sem, causal, with_mask=True
        )
    else:
        expected = [_head_parallel_bytes(world, heads, masked)] * world
    for rank, r in enumerate(per_rank):
        comm = {name: value for name, value in r[key]["comm"].items() if name != "forward_calls"}
        assert comm == expected[rank], (where, rank)
        if c == 1 or impl not in STRATEGY:  # ŵ = N' spans the ranks: the padded buffers really travel
            assert sum(comm.values()) > 0, (where, rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_block_sparse_ring_is_exact_on_padded_shards(world):
    per_rank = run_distributed(sw.padded_block_sparse_cases, world, timeout_s=300)
    for c, (options, n) in enumerate(sw.BS_PADDED):
        for causal in (False, True):
            q, k, v, up, mask = sw.full_inputs(10 * c + causal, n, 3, masked=c == 2)
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            table = BlockSparseRingDilatedAttention(block_size=8, **options).block_table(n, 3)
            ref, ref_lse = block_sparse_reference(q, k, v, table, 8, causal, key_padding_mask=mask)
            ref_grads = torch.autograd.grad(ref, (q, k, v), up)
            where = (world, options["pattern"], causal)
            _check_against(per_rank, (c, causal), n, ref, ref_lse, ref_grads, where)
            for rank, r in enumerate(per_rank):
                comm = {key: value for key, value in r[c, causal]["comm"].items() if key != "forward_calls"}
                assert comm == r[c, causal]["expected"], (where, rank)


def test_the_padded_table_would_differ_without_seq_len():
    """The block-sparse cases above need the real length: the table of the padded length attends other blocks."""
    for options, n in sw.BS_PADDED[:2]:
        module = BlockSparseRingDilatedAttention(block_size=8, **options)
        real, padded = module.block_table(n, 3), module.block_table(64, 3)
        assert not torch.equal(padded[: real.shape[0], : real.shape[0]], real), options


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_ring_multihead_is_exact_on_padded_shards(world):
    per_rank = run_distributed(sw.padded_multihead_cases, world, timeout_s=300)
    for causal in (False, True):
        module = sw.multihead_weights().double()
        module.attention = ReferenceCore(module.attention, torch.float64)
        x, up, mask = sw.multihead_inputs(int(causal))
        x = x.requires_grad_()
        ref, _ = module(x, x, x, is_causal=causal, key_padding_mask=mask)
        grads = torch.autograd.grad(ref, [x, *module.parameters()], up)
        ref_params = torch.cat([g.flatten() for g in grads[1:]])
        out = join_shards([r[causal]["out"] for r in per_rank], sw.N)
        dx = join_shards([r[causal]["dx"] for r in per_rank], sw.N)
        dparams = torch.stack([r[causal]["dparams"] for r in per_rank]).sum(0)
        assert rel_err(out, ref) <= 1e-5 and rel_err(dx, grads[0]) <= 1e-4, (world, causal)
        assert rel_err(dparams, ref_params) <= 1e-4, (world, causal)


@pytest.mark.slow
def test_verify_no_longer_refuses_shards_for_n_over_p(tmp_path, capsys):
    import json

    from tests.cli.test_verify_env import run_cli

    report = tmp_path / "v.json"
    code, out, err = run_cli(
        [
            "verify",
            "--impl",
            "RingDilatedAttention",
            "--world-size",
            "3",
            "--semantics",
            "longnet",
            "--causal",
            "--json",
            str(report),
        ],
        capsys,
    )
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert not [s for s in data["skipped"] if "N/p" in s or "divisible" in s or "segment length" in s], data["skipped"]
    cases = {r["case"] for r in data["results"]}
    assert {"ragged N", "w % r != 0, no r=1", "divisible, batch 3", "w <, =, > N/p"} <= cases  # all refused before
    assert all(r["passed"] for r in data["results"])
    assert max(e["rel"] for r in data["results"] for name, e in r["errors"].items() if name.startswith("d")) <= 1e-4
