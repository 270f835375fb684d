"""Multihead modules: projections, MAGNETO LayerNorm, masks, and their API hygiene."""

import copy
import inspect

import pytest
import torch

from dattn_cli.kernels import ImprovedMultiheadDilatedAttention, MultiheadDilatedAttention
from dattn_cli.kernels.reference import dilated_attention_reference
from tests.conftest import rel_err

MULTI = [MultiheadDilatedAttention, ImprovedMultiheadDilatedAttention]


class ReferenceCore(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, q, k, v, is_causal=False, key_padding_mask=None):
        return dilated_attention_reference(
            q,
            k,
            v,
            self.core.segment_lengths,
            self.core.dilation_rates,
            is_causal,
            self.core.semantics,
            key_padding_mask=key_padding_mask,
        )[0]


def grads_of(module, x, upstream, **kw):
    x = x.clone().requires_grad_()
    out, weights = module(x, x, x, **kw)
    assert weights is None
    params = list(module.parameters())
    return out, torch.autograd.grad(out, [x, *params], upstream.to(out.dtype))


@pytest.mark.parametrize("cls", MULTI)
@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_outputs_and_parameter_grads_match_reference(cls, layer_norm, causal):
    module = cls(40, 5, segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 3], layer_norm=layer_norm)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = copy.deepcopy(module).double()
    ref.attention = ReferenceCore(module.attention)
    x = torch.randn(2, 37, 40, dtype=torch.float64)
    upstream = torch.randn(2, 37, 40, dtype=torch.float64)
    out, grads = grads_of(module, x.float(), upstream, is_causal=causal)
    ref_out, ref_grads = grads_of(ref, x, upstream, is_causal=causal)
    assert out.dtype == torch.float32
    assert rel_err(out, ref_out) <= 1e-5
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= 1e-4


@pytest.mark.parametrize("cls", MULTI)
def test_separate_projections_equal_fused_on_equal_inputs(cls):
    module = cls(32, 4, segment_lengths=[8, 16], dilation_rates=[1, 2])
    x = torch.randn(1, 32, 32)
    fused, _ = module(x, x, x)
    separate, _ = module(x, x.clone(), x.clone())
    assert rel_err(separate, fused) <= 1e-6


@pytest.mark.parametrize("cls", MULTI)
def test_key_padding_mask_is_honoured(cls):
    module = cls(32, 4, segment_lengths=[8, 16], dilation_rates=[1, 2])
    q = torch.randn(2, 32, 32)
    kv = torch.randn(2, 32, 32)
    mask = torch.zeros(2, 32, dtype=torch.bool)
    mask[:, 20:] = True
    out, _ = module(q, kv, kv, key_padding_mask=mask)
    changed = kv.clone()
    changed[:, 20:] = torch.randn(2, 12, 32) * 10
    out2, _ = module(q, changed, changed, key_padding_mask=mask)
    assert rel_err(out2, out) <= 1e-6  # padded keys change nothing
    unmasked, _ = module(q, changed, changed)
    assert (unmasked - out).abs().max() > 1e-2


@pytest.mark.parametrize("cls", MULTI)
def test_unsupported_masks_raise(cls):
    module = cls(16, 2, segment_lengths=[8], dilation_rates=[1])
    x = torch.randn(1, 8, 16)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        module(x, x, x, attn_mask=torch.zeros(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="need_weights"):
        module(x, x, x, need_weights=True)


@pytest.mark.parametrize("cls", MULTI)
def test_pattern_lists_are_keyword_only(cls):
    params = inspect.signature(cls.__init__).parameters
    assert params["segment_lengths"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["dilation_rates"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError):
        cls(16, 2, [8], [1])


@pytest.mark.parametrize("cls", MULTI)
def test_magneto_init_gain(cls):
    torch.manual_seed(0)
    e = 256
    module = cls(e, 4, segment_lengths=[8], dilation_rates=[1], gamma_init=3.0)
    std = (2.0 / (e + e)) ** 0.5
    w = module.in_proj.weight
    assert abs(w[:e].std().item() - std) < 0.1 * std
    assert abs(w[2 * e :].std().item() - 3 * std) < 0.3 * std
    assert abs(module.out_proj.weight.std().item() - 3 * std) < 0.3 * std
    assert torch.all(module.in_proj.bias == 0)


@pytest.mark.parametrize("cls", MULTI)
def test_dtype_device_factory_and_output_dtype(cls):
    module = cls(16, 2, segment_lengths=[8], dilation_rates=[1], dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in module.parameters())
    out, _ = module(*(torch.randn(1, 8, 16, dtype=torch.float64),) * 3)
    assert out.dtype == torch.float64


def test_bad_configuration_messages():
    with pytest.raises(ValueError, match="embed_dim=30 is not divisible by num_heads=4"):
        MultiheadDilatedAttention(30, 4, segment_lengths=[8], dilation_rates=[1])
    m = MultiheadDilatedAttention(16, 2, segment_lengths=[8], dilation_rates=[1])
    with pytest.raises(ValueError, match=r"query has shape \(1, 8, 12\)"):
        m(torch.randn(1, 8, 12), torch.randn(1, 8, 12), torch.randn(1, 8, 12))
