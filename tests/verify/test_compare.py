"""The tolerance policy: err(impl) <= FACTOR x err(naive) + FLOOR, relative to the reference's size."""

import math

import torch

from dattn_cli.verify.compare import FACTOR, FLOOR, judge, max_errors


def test_passes_within_the_factor_of_the_naive_error_and_fails_beyond():
    ref = torch.linspace(-2, 2, 1000, dtype=torch.float64)
    naive = 1e-3  # relative
    near = ref + (FACTOR * naive + FLOOR["value"]) * 0.9 * 2  # max |ref| = 2
    far = ref + (FACTOR * naive + FLOOR["value"]) * 1.1 * 2
    assert judge("out", near, ref, naive, torch.bfloat16).passed
    e = judge("out", far, ref, naive, torch.bfloat16)
    assert not e.passed and e.naive == naive and math.isclose(e.limit, FACTOR * naive + FLOOR["value"])


def test_the_floor_decides_in_float64_and_gradients_get_their_own():
    ref = torch.ones(10, dtype=torch.float64)
    assert judge("dq", ref + 5e-5, ref, 0.0, torch.float64).passed  # under the gradient floor 1e-4
    assert not judge("out", ref + 5e-5, ref, 0.0, torch.float64).passed  # over the value floor 1e-5


def test_a_non_finite_mismatch_fails_even_with_an_infinite_naive_error():
    ref = torch.tensor([0.0, float("-inf")], dtype=torch.float64)
    got = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert max_errors(got, ref)[0] == float("inf")
    assert not judge("lse", got, ref, float("inf"), torch.bfloat16).passed


def test_compares_a_slice_at_a_time(monkeypatch):
    import dattn_cli.verify.compare as compare

    monkeypatch.setattr(compare, "STEP", 7)
    ref = torch.randn(100, dtype=torch.float64)
    got = ref.clone()
    got[93] += 0.5
    diff, scale = max_errors(got, ref)
    assert abs(diff - 0.5) < 1e-12 and scale == ref.abs().max().item()


def test_finite_and_non_finite_slices_agree_with_the_entrywise_definition(monkeypatch):
    import dattn_cli.verify.compare as compare

    monkeypatch.setattr(compare, "STEP", 4)  # slices all finite, with -inf in both, and with a nan in got only
    ref = torch.tensor([1.0, -3.0, 0.5, 2.0, float("-inf"), 1.0, -1.0, 0.0], dtype=torch.float64)
    got = torch.tensor([1.25, -3.0, 0.5, 2.0, float("-inf"), 1.0, -1.5, 0.0], dtype=torch.float32)
    assert max_errors(got, ref) == (0.5, 3.0)
    got[2] = float("nan")
    assert max_errors(got, ref)[0] == float("inf")
    assert max_errors(got.to(torch.bfloat16), ref)[0] == float("inf")
