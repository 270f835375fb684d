import pytest

from dattn_cli.bench import Sweep
from dattn_cli.kernels import ImplSpec, registry as registry_module
from dattn_cli.kernels.baselines import SDPAAttention


def test_config_validation():
    ok = dict(impls=["sdpa"], seq_lens=[1024], max_memory=2**30)
    Sweep(**ok)
    with pytest.raises(ValueError, match="exactly one of --seq-len and --until-oom"):
        Sweep(**{**ok, "until_oom": True})
    with pytest.raises(ValueError, match="--batch must be >= 1"):
        Sweep(**{**ok, "batch": 0})
    with pytest.raises(ValueError, match="one dilation rate per segment length"):
        Sweep(**{**ok, "segment_lengths": [8, 16], "dilation_rates": [1]})


def test_an_implementation_that_cannot_run_here_is_refused_with_its_install_hint(monkeypatch):
    """A library user gets the refusal too, before anything is measured: a module missing, with the fix."""
    spec = ImplSpec(
        "needs-a-module",
        SDPAAttention,
        "core",
        "dense",
        "needs a module nobody has",
        baseline=True,
        requires=("dattn_no_such_module",),
        install_hint="pip install 'dattn[nothing]'",
    )
    monkeypatch.setitem(registry_module.REGISTRY, spec.name, spec)
    with pytest.raises(
        ValueError,
        match=r"--impl needs-a-module cannot run with --device cpu: needs "
        r"dattn_no_such_module: pip install 'dattn\[nothing\]'",
    ):
        Sweep(impls=["sdpa", spec.name], seq_lens=[1024], max_memory=2**30)


def test_flash_on_cpu_names_the_device_and_the_install_hint():
    import importlib.util

    with pytest.raises(ValueError) as refused:
        Sweep(impls=["flash"], seq_lens=[1024], max_memory=2**30)
    message = str(refused.value)
    assert "--impl flash cannot run with --device cpu: runs on cuda only" in message
    if importlib.util.find_spec("flash_attn") is None:
        assert "pip install 'dattn[flash]'" in message
