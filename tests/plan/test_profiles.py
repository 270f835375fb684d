"""Every shipped profile validates; each kind of bad profile is one line naming file and field, exit 2."""

import pytest

from dattn_cli.plan.profiles import ProfileError, load_profile, shipped_profiles
from tests.cli.test_verify_env import run_cli

REQUIRED = {
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "h100-sxm-80gb",
    "h100-pcie-80gb",
    "h200-141gb",
    "l4",
    "rtx-4090",
    "rtx-3090",
    "gtx-1080",
    "mi300x",
    "cpu-host",
}


def test_every_shipped_profile_validates_and_cites_sources():
    assert REQUIRED <= set(shipped_profiles())
    for name in shipped_profiles():
        profile = load_profile(name)
        assert {"peak_tflops", "memory", "interconnect"} <= set(profile.sources)
        assert profile.memory_bytes > 0


def test_validate_command_passes_on_shipped_profiles(capsys):
    code, out, _ = run_cli(["profiles", "validate"], capsys)
    assert code == 0 and out.count("ok:") == len(shipped_profiles())


BASE = (shipped_profiles()["h100-sxm-80gb"]).read_text()
BAD = {
    "not yaml": ("name: [unclosed\n", "not valid YAML"),
    "missing field": (BASE.replace("memory_gib: 74.5", ""), "field memory_gib is missing"),
    "wrong unit": (BASE.replace("memory_gib: 74.5", "memory_gib: 80GB"), "field memory_gib"),
    "unit in a new field": (
        BASE.replace("memory_gib: 74.5", "memory_gib: 74.5\nmemory_gb: 80"),
        "field memory_gb is not a profile field",
    ),
    "wrong type": (BASE.replace("devices_per_node: 8", "devices_per_node: eight"), "field devices_per_node"),
    "negative": (
        BASE.replace("memory_bandwidth_gb_s: 3350", "memory_bandwidth_gb_s: -3350"),
        "field memory_bandwidth_gb_s",
    ),
    "not a mapping": ("- 1\n- 2\n", "expected a mapping"),
    "code in yaml": ("!!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_profiles_are_one_line_exit_2(case, tmp_path, capsys):
    text, expected = BAD[case]
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=expected):
        load_profile(path)
    code, _, err = run_cli(["profiles", "validate", str(path)], capsys)
    assert code == 2 and str(path) in err and expected.split()[0] in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_profile_name_lists_the_shipped_ones(capsys):
    code, _, err = run_cli(["plan", "--profile", "tpu-v9"], capsys)
    assert code == 2 and "h100-sxm-80gb" in err


def test_show_round_trips(tmp_path, capsys):
    code, out, _ = run_cli(["profiles", "show", "l4"], capsys)
    assert code == 0
    path = tmp_path / "copy.yaml"
    path.write_text(out)
    assert load_profile(path) == load_profile("l4")
