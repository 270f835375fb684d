"""Bad configuration and bad tensors raise ValueError naming the parameter and the fix."""

import pytest
import torch

from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention, dilated_attention_reference

CORE = [DilatedAttention, ImprovedDilatedAttention]


@pytest.mark.parametrize("cls", CORE)
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(segment_lengths=[8, 16], dilation_rates=[1]), "one dilation rate per segment length"),
        (dict(segment_lengths=[0, 16], dilation_rates=[1, 2]), "segment_lengths must hold positive integers"),
        (dict(segment_lengths=[8], dilation_rates=[-1]), "dilation_rates must hold positive integers"),
        (dict(segment_lengths=[], dilation_rates=[]), "segment_lengths is empty"),
        (dict(segment_lengths=[8], dilation_rates=[1], semantics="bogus"), "semantics='bogus' is unknown"),
        (dict(segment_lengths=[8], dilation_rates=[1], backend="cuda-magic"), "backend='cuda-magic' is unknown"),
        (dict(segment_lengths=[8], dilation_rates=[1], dropout=1.5), "dropout must be in"),
        (dict(segment_lengths=[8], dilation_rates=[1], dropout=0.1, backend="sdpa"), "use backend='math' or 'auto'"),
        (dict(segment_lengths=[8], dilation_rates=[1], scale=-1.0), "scale must be a positive number"),
    ],
)
def test_bad_configuration(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", CORE)
def test_bad_tensors(cls):
    m = cls([8], [1])
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="q has 3 dimensions"):
        m(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="shapes differ"):
        m(q, torch.randn(1, 9, 2, 4), q)
    with pytest.raises(ValueError, match="dtypes differ"):
        m(q, q.double(), q)
    with pytest.raises(ValueError, match="key_padding_mask must be a bool tensor of shape"):
        m(q, q, q, key_padding_mask=torch.zeros(1, 8))
    with pytest.raises(ValueError, match="head_groups semantics needs at least one head per pair"):
        cls([8, 16, 32], [1, 2, 4], semantics="head_groups")(q, q, q)


def test_reference_validates_too():
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="one dilation rate per segment length"):
        dilated_attention_reference(q, q, q, [8, 4], [1])
    with pytest.raises(
        ValueError, match="head_groups semantics needs at least one head per pair: num_heads >= 3 pairs, got 2"
    ):
        dilated_attention_reference(q, q, q, [2, 4, 8], [1, 2, 4], semantics="head_groups")


def test_no_process_wide_torch_settings_touched():
    def flags():
        return (
            torch.get_default_dtype(),
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.are_deterministic_algorithms_enabled(),
            torch.get_float32_matmul_precision(),
            torch.get_num_threads(),
        )

    before = flags()
    import dattn_cli.cli.commands  # noqa: F401  (importing everything: the app and every command)
    from dattn_cli.kernels import ImprovedMultiheadDilatedAttention

    m = ImprovedMultiheadDilatedAttention(16, 2, segment_lengths=[8], dilation_rates=[1])
    m(*(torch.randn(1, 8, 16),) * 3)[0].sum().backward()
    assert flags() == before


def test_flash_backend_refuses_a_key_padding_mask():
    from dattn_cli.kernels.backends import BlockCall, FlashBackend

    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="flash backend takes no key_padding_mask; use backend='sdpa'"):
        FlashBackend().forward(q, q, q, torch.zeros(1, 8, dtype=torch.bool), BlockCall(causal=False, scale=0.25))
