"""torch.compile: the default single-device and multihead modules compile with fullgraph=True (one custom op,
kernels/compiled.py) and give the eager output and gradients."""

import pytest
import torch

from dattn_cli.kernels import (
    DilatedAttention,
    ImprovedDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
)

SEGS, RATES = [64, 128], [1, 2]


def _core(cls):
    return cls(SEGS, RATES), [torch.randn(2, 200, 4, 16, requires_grad=True) for _ in range(3)]


def _multihead(cls):
    x = torch.randn(2, 200, 64, requires_grad=True)
    return cls(64, 4, segment_lengths=SEGS, dilation_rates=RATES), [x, x, x]


CASES = [
    (_core, ImprovedDilatedAttention),
    (_core, DilatedAttention),
    (_multihead, ImprovedMultiheadDilatedAttention),
    (_multihead, MultiheadDilatedAttention),
]


def _out(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("make, cls", CASES, ids=[c.__name__ for _, c in CASES])
def test_no_graph_breaks(make, cls):
    torch._dynamo.reset()
    module, inputs = make(cls)
    assert torch._dynamo.explain(module)(*inputs).graph_break_count == 0


@pytest.mark.slow
@pytest.mark.parametrize("make, cls", CASES, ids=[c.__name__ for _, c in CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_equals_eager_with_gradients(make, cls, causal):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module, inputs = make(cls)
    mask = torch.zeros(2, 200, dtype=torch.bool)
    mask[1, 150:] = True  # a padded tail in the second sequence
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    leaves = list(dict.fromkeys(inputs)) + list(module.parameters())
    got = _out(compiled(*inputs, is_causal=causal, key_padding_mask=mask))
    want = _out(module(*inputs, is_causal=causal, key_padding_mask=mask))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weights = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, leaves, weights), torch.autograd.grad(want, leaves, weights)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gqa_compiles_without_graph_breaks_and_equals_eager():
    """k, v with 2 kv heads of 8 (their repetition is traced around the op), and a multihead module with
    num_kv_heads: no graph breaks, the eager output and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    core = ImprovedDilatedAttention(SEGS, RATES)
    q = torch.randn(1, 200, 8, 16, requires_grad=True)
    k, v = (torch.randn(1, 200, 2, 16, requires_grad=True) for _ in range(2))
    assert torch._dynamo.explain(core)(q, k, v).graph_break_count == 0
    got = torch.compile(core, fullgraph=True, backend="aot_eager")(q, k, v, is_causal=True)
    want = core(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    up = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), up), torch.autograd.grad(want, (q, k, v), up)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    mha = ImprovedMultiheadDilatedAttention(64, 8, segment_lengths=SEGS, dilation_rates=RATES, num_kv_heads=2)
    x = torch.randn(2, 200, 64)
    assert torch._dynamo.explain(mha)(x, x, x).graph_break_count == 0
