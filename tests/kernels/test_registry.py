import pytest
import torch

from dattn_cli.kernels import (
    REGISTRY,
    DilatedAttention,
    ImprovedDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    create_dilated_attention,
    create_multihead_dilated_attention,
)


def test_registry_holds_the_single_device_implementations():
    assert {
        "DilatedAttention",
        "ImprovedDilatedAttention",
        "MultiheadDilatedAttention",
        "ImprovedMultiheadDilatedAttention",
    } <= REGISTRY.keys()


def test_auto_factory_says_what_it_chose_and_why():
    m = create_dilated_attention(segment_lengths=[8, 16], dilation_rates=[1, 2])
    assert isinstance(m, ImprovedDilatedAttention)
    assert "auto chose ImprovedDilatedAttention (world size 1" in m.describe()
    q = torch.randn(1, 16, 2, 4)
    m(q, q, q)
    assert "backend auto -> sdpa on the last call" in m.describe()
    mh = create_multihead_dilated_attention(embed_dim=16, num_heads=2, segment_lengths=[8], dilation_rates=[1])
    assert isinstance(mh, ImprovedMultiheadDilatedAttention) and "auto chose" in mh.describe()


def test_factory_by_name_and_errors():
    assert isinstance(
        create_dilated_attention("DilatedAttention", segment_lengths=[8], dilation_rates=[1]), DilatedAttention
    )
    with pytest.raises(ValueError, match="unknown implementation 'nope'"):
        create_dilated_attention("nope", segment_lengths=[8], dilation_rates=[1])
    with pytest.raises(ValueError, match="is a multihead implementation"):
        create_dilated_attention("MultiheadDilatedAttention", segment_lengths=[8], dilation_rates=[1])


def test_auto_backend_choices():
    q = torch.randn(1, 16, 2, 4, dtype=torch.float64)
    m = create_dilated_attention(segment_lengths=[8], dilation_rates=[1], dropout=0.2)
    m(q, q, q)
    assert m.last_backend[0] == "math" and "dropout" in m.last_backend[1]
    m.eval()
    m(q, q, q)
    assert m.last_backend[0] == "sdpa"


def test_auto_shards_one_sequence_only_when_a_sequence_parallel_group_is_given():
    from dattn_cli.runtime.launch import run_distributed
    from tests.distributed import workers

    for choices in run_distributed(workers.auto_choices, 2, timeout_s=60):
        for name in ("core", "core, process_group=None"):  # a plain data-parallel job: each rank its own batch
            cls, why = choices[name]
            assert cls == "ImprovedDilatedAttention", (name, cls)
            assert "world size 2 but no process_group given: data parallel, single-device" in why
        assert choices["multihead"][0] == "ImprovedMultiheadDilatedAttention"
        cls, why = choices["core, process_group"]
        assert cls == "RingDilatedAttention" and "process_group of 2 rank(s) given: sequence parallel" in why
        assert choices["multihead, process_group"][0] == "RingMultiheadDilatedAttention"


def test_auto_with_a_group_but_no_process_group_initialised_says_so():
    with pytest.raises(ValueError, match="process_group is given but torch.distributed is not initialised"):
        create_dilated_attention(segment_lengths=[8], dilation_rates=[1], process_group=object())
    m = create_dilated_attention(segment_lengths=[8], dilation_rates=[1], process_group=None)
    assert isinstance(m, ImprovedDilatedAttention) and "world size 1" in m.selection_reason


def test_every_distributed_form_has_a_registered_multihead_wrapper():
    forms = lambda kind: {s.strategy for s in REGISTRY.values() if s.kind == kind and s.distributed}  # noqa: E731
    assert forms("core") == forms("multihead") == {"ring", "allgather", "head_parallel", "hybrid", "block_sparse"}


def test_the_registry_is_complete_wherever_it_is_imported_from():
    """dattn's entries live in kernels/entries.py; importing the registry module alone (as a plugin does) finds
    them all, and entries cannot be taken back out (issue 31: no unregister)."""
    import subprocess
    import sys

    code = "from dattn_cli.kernels.registry import REGISTRY; print(sorted(REGISTRY))"
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in ("ImprovedDilatedAttention", "RingDilatedAttention", "sdpa", "flash4", "cudnn", "flex_dilated"):
        assert repr(name) in names
    from dattn_cli.kernels import registry

    assert not hasattr(registry, "unregister")


def test_a_spec_probe_says_why_it_cannot_run(monkeypatch):
    from dattn_cli.kernels.registry import ImplSpec

    spec = ImplSpec("Probed", DilatedAttention, "core", "single", "probed", probe=lambda: "built for another torch")
    assert spec.unavailable("cpu") == "built for another torch"
    assert ImplSpec("Fine", DilatedAttention, "core", "single", "fine", probe=lambda: None).unavailable("cpu") is None
