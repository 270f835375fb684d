import pytest

from dattn_cli.bench import Sweep


def test_config_validation():
    ok = dict(impls=["sdpa"], seq_lens=[1024], max_memory=2**30)
    Sweep(**ok)
    with pytest.raises(ValueError, match="exactly one of --seq-lens and --until-oom"):
        Sweep(**{**ok, "until_oom": True})
    with pytest.raises(ValueError, match="--batch must be >= 1"):
        Sweep(**{**ok, "batch": 0})
    with pytest.raises(ValueError, match="one dilation rate per segment length"):
        Sweep(**{**ok, "segment_lengths": [8, 16], "dilation_rates": [1]})
