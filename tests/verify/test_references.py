"""Inputs are a function of (case, seed), and each reference is computed once and shared by every
implementation checked against it, in any run order."""

import pytest
import torch

from dattn_cli.verify import run_verify
from dattn_cli.verify.cases import own_cases
from dattn_cli.verify.checks import impl_checks
from dattn_cli.verify.references import ReferenceCache, case_seed, draw_inputs, uses_local_reference
from dattn_cli.verify.run import collect_checks, run_checks
from dattn_cli.verify.variants import Grid

SHAPE = dict(heads=4, head_dim=8, segment_lengths=[16, 32], dilation_rates=[1, 2])


def grid(dtype="float32"):
    return Grid(["longnet"], [False, True], ["auto"], ["dilated"], dtype, "cpu")


def test_inputs_depend_on_case_and_seed_only():
    case = own_cases([64], **SHAPE)[0]
    a, b = (
        impl_checks(name, [case], grid(), [])[0].problem for name in ("DilatedAttention", "ImprovedDilatedAttention")
    )
    (qa, ka, va), ua = draw_inputs(a, case_seed(case.name, 3))
    (qb, kb, vb), ub = draw_inputs(b, case_seed(case.name, 3))
    assert all(torch.equal(x, y) for x, y in zip((qa, ka, va, ua), (qb, kb, vb, ub)))
    assert qa.dtype == torch.float32
    assert case_seed(case.name, 3) != case_seed(case.name, 4) != case_seed("other", 4)


def test_one_reference_per_key_shared_by_every_implementation(monkeypatch):
    computed = []
    original = ReferenceCache.get

    def counting(self, case, p):
        before = self.computed
        entry = original(self, case, p)
        computed.extend([p.impl] * (self.computed - before))
        return entry

    monkeypatch.setattr(ReferenceCache, "get", counting)
    report = run_verify(
        ["DilatedAttention", "ImprovedDilatedAttention"],
        cases=own_cases([64], **SHAPE),
        semantics=["longnet"],
        causal=[False, True],
    )
    assert report.passed and len(report.results) == 4
    assert len(computed) == 2  # causal and non-causal: one reference each for both implementations
    # the report keeps the collected order (implementation by implementation), not the run order
    assert [r.impl for r in report.results] == ["DilatedAttention"] * 2 + ["ImprovedDilatedAttention"] * 2


def test_the_same_errors_whatever_else_is_checked():
    """A check's result does not depend on the checks run before it (no shared generator)."""
    alone = run_verify(
        ["ImprovedDilatedAttention"], cases=own_cases([64], **SHAPE), semantics=["longnet"], causal=[True]
    )
    checks = collect_checks(
        ["DilatedAttention", "ImprovedDilatedAttention"],
        cases=own_cases([64], **SHAPE),
        semantics=["longnet"],
        causal=[False, True],
    )
    both = run_checks(checks)
    mine = [r for r in both.results if r.impl == "ImprovedDilatedAttention" and r.causal]
    assert mine[0].errors == alone.results[0].errors


def test_the_local_reference_is_picked_above_the_stated_length():
    short, long = (
        impl_checks("DilatedAttention", own_cases([n], **SHAPE), grid(), [])[0].problem for n in (1024, 1025)
    )
    assert not uses_local_reference(short) and uses_local_reference(long)


def test_multihead_classes_with_one_forward_and_the_same_weights_share_a_reference(monkeypatch):
    computed = []
    original = ReferenceCache.get

    def counting(self, case, p):
        before = self.computed
        entry = original(self, case, p)
        computed.extend([p.impl] * (self.computed - before))
        return entry

    monkeypatch.setattr(ReferenceCache, "get", counting)
    report = run_verify(
        ["MultiheadDilatedAttention", "ImprovedMultiheadDilatedAttention"],
        cases=own_cases([64], **SHAPE),
        semantics=["longnet"],
        causal=[False],
    )
    assert report.passed and computed == ["MultiheadDilatedAttention"]


def test_process_groups_sharing_a_reference_run_together(monkeypatch):
    """References of N = 16K and more exceed the cache, which then keeps only the last: the groups whose checks
    share one run one after another, so it is computed once, and the report keeps the collected order."""
    from dattn_cli.verify import references, run as verify_run
    from dattn_cli.verify.report import case_result

    monkeypatch.setattr(references, "CACHE_BYTES", 0)
    ran, computed = [], []

    def group(name, world, checks, cache, timeout_s, attached):  # stands in for the spawned ranks
        ran.append(name)
        for v in checks:
            before = cache.computed
            cache.get(v.case, v.problem)
            computed.extend([name] * (cache.computed - before))
        return [case_result(v, failure="not run here") for v in checks]

    monkeypatch.setattr(verify_run, "verify_group", group)
    impls = ["RingDilatedAttention", "RingMultiheadDilatedAttention", "DistributedImprovedDilatedAttention"]
    checks = collect_checks(
        impls, world_sizes=[2], cases=own_cases([64], **SHAPE), semantics=["longnet"], causal=[False]
    )
    report = run_checks(checks)
    assert ran == ["RingDilatedAttention", "DistributedImprovedDilatedAttention", "RingMultiheadDilatedAttention"]
    assert computed == ["RingDilatedAttention", "RingMultiheadDilatedAttention"]
    assert [r.impl for r in report.results] == impls


@pytest.mark.parametrize("layer_norm", [True, False])
def test_output_gradient_is_the_gradient_the_core_output_gets(layer_norm):
    """Bitwise, for the whole sequence and for any rows: the reference uses what it computed only if autograd
    then hands it exactly that gradient."""
    from dattn_cli.kernels.multihead import MultiheadDilatedAttention
    from dattn_cli.verify.references import output_gradient

    torch.manual_seed(0)
    module = MultiheadDilatedAttention(
        32, 4, segment_lengths=[8, 16], dilation_rates=[1, 2], layer_norm=layer_norm, dtype=torch.float64
    )
    x, up = (torch.randn(2, 24, 32, dtype=torch.float64) for _ in range(2))
    seen = []
    module.attention.register_forward_hook(lambda _m, _a, out: seen.append(out) or out.retain_grad())
    module(x, x, x)[0].backward(up)
    out, got = seen[0].detach(), seen[0].grad
    gradient = output_gradient(module, up)
    if not layer_norm:
        assert torch.equal(gradient, got)
        return
    rows = torch.tensor([1, 5, 6, 20])
    assert torch.equal(gradient(slice(None), out), got)
    assert torch.equal(gradient(rows, out.index_select(1, rows)), got.index_select(1, rows))
    assert torch.equal(gradient(slice(3, 11, 2), out[:, 3:11:2]), got[:, 3:11:2])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_multihead_block_sparse_reference_is_given_its_core_gradient(monkeypatch, dtype):
    """Above LOCAL_REFERENCE_ABOVE the reference (float64) and the naive computation of a multihead module on a
    block table recompute no chunk, and give what the recomputing path gives (float64: to 1e-12)."""
    import dattn_cli.kernels.reference_local as local
    from dattn_cli.verify import references
    from dattn_cli.verify.cases import for_impl

    case = own_cases([1100], heads=4, head_dim=8, segment_lengths=[256, 512], dilation_rates=[1, 2])[0]
    p = for_impl(case.problem, "BlockSparseRingMultiheadDilatedAttention", pattern="longnet").with_(causal=True)
    compute = torch.float64 if dtype == "float64" else torch.float32
    recomputed = []
    real = local._accumulate
    monkeypatch.setattr(local, "_accumulate", lambda *a: recomputed.append(1) or real(*a))
    given = references.reference_outputs(p, 7, compute)
    assert not recomputed
    monkeypatch.setattr(references, "output_gradient", lambda module, upstream: None)
    again = references.reference_outputs(p, 7, compute)
    assert recomputed
    tol = 1e-12 if compute == torch.float64 else 1e-5
    for key, value in again.items():
        assert ((given[key] - value).abs().max() / value.abs().max()).item() < tol, key
