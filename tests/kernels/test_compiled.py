"""torch.compile: the default single-device and multihead modules compile with fullgraph=True (one custom op,
kernels/compiled.py) and give the eager output and gradients."""

import pytest
import torch

from dattn_cli.kernels import (
    DilatedAttention, ImprovedDilatedAttention, ImprovedMultiheadDilatedAttention, MultiheadDilatedAttention,
)

SEGS, RATES = [64, 128], [1, 2]


def _core(cls):
    return cls(SEGS, RATES), [torch.randn(2, 200, 4, 16, requires_grad=True) for _ in range(3)]


def _multihead(cls):
    x = torch.randn(2, 200, 64, requires_grad=True)
    return cls(64, 4, segment_lengths=SEGS, dilation_rates=RATES), [x, x, x]


CASES = [(_core, ImprovedDilatedAttention), (_core, DilatedAttention), (_multihead, ImprovedMultiheadDilatedAttention),
         (_multihead, MultiheadDilatedAttention)]


def _out(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("make, cls", CASES, ids=[c.__name__ for _, c in CASES])
def test_no_graph_breaks(make, cls):
    torch._dynamo.reset()
    module, inputs = make(cls)
    assert torch._dynamo.explain(module)(*inputs).graph_break_count == 0


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
