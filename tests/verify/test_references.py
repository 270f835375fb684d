"""Inputs are a function of (case, seed), and each reference is computed once and shared by every
implementation checked against it, in any run order."""

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
