"""Issue 16, inputs (items 10, 11, 15): YAML files (hardware profiles, --config) are read without expanding
aliases, bounded in size and nesting; every profile figure is a plain finite number within stated bounds;
an error echoes at most 200 characters of what the user wrote. Each case: one line on stderr, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from dattn_cli.plan.profiles import shipped_profiles
from tests.cli.test_verify_env import run_cli

CPU_HOST = shipped_profiles()["cpu-host"].read_text()


def alias_bomb(levels: int) -> str:
    """A few hundred bytes that expand to 9**levels lists of ten-character strings."""
    lines = ["a0: &a0 [" + ", ".join(['"xxxxxxxxxx"'] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def profile_with(tmp_path: Path, old: str, new: str) -> str:
    assert old in CPU_HOST
    path = tmp_path / "custom.yaml"
    path.write_text(CPU_HOST.replace(old, new))
    return str(path)


def one_error_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("dattn: note")]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("dattn: error: "), err[-2000:]
    assert "Traceback" not in err
    return lines[0]


# --- item 10: aliases, sizes, echoed input ----------------------------------------------------------------


def test_profile_alias_bomb_is_refused_before_expansion(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(5) + CPU_HOST.replace("name: Generic CPU host", "name: *a5"))  # the bomb is 420 bytes
    line = one_error_line(*run_cli(["plan", "--profile", str(path)], capsys)[::2])
    assert "aliases" in line and len(line) < 1000


def test_config_alias_bomb_and_plain_aliases_are_refused(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb(5) + "plan: {heads: *a5}\n")
    line = one_error_line(*run_cli(["--config", str(bomb), "plan"], capsys)[::2])
    assert "aliases" in line and len(line) < 1000
    aliased = tmp_path / "aliased.yaml"  # harmless in itself, but nothing here needs one: refused all the same
    aliased.write_text("plan: {heads: &h 2, head_dim: *h, seq_len: 4k, segments: '1024', dilations: '1'}\n")
    line = one_error_line(*run_cli(["--config", str(aliased), "plan"], capsys)[::2])
    assert "anchors (&name) and aliases (*name) are not allowed" in line


def test_yaml_files_are_bounded_in_size_and_nesting(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 250_000)  # 2.5 MB of comments: valid YAML, but no option file is this large
    line = one_error_line(*run_cli(["--config", str(big), "plan"], capsys)[::2])
    assert "larger than" in line
    deep = tmp_path / "deep.yaml"
    deep.write_text("plan: " + "[" * 5000 + "]" * 5000 + "\n")  # RecursionError in the composer before
    line = one_error_line(*run_cli(["--config", str(deep), "plan"], capsys)[::2])
    assert "nested" in line
    deep_profile = tmp_path / "deep_profile.yaml"
    deep_profile.write_text("[" * 5000 + "]" * 5000 + "\n")
    assert "nested" in one_error_line(*run_cli(["plan", "--profile", str(deep_profile)], capsys)[::2])


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--impl", "x" * 5000],
        ["plan", "--seq-len", "x" * 5000],
        ["plan", "--dtype", "x" * 5000],  # click's own message
        ["plan", "--profile", "x" * 5000],
        ["plan", "--max-memory", "9" * 5000],
        ["plan", "--segments", "x" * 5000],
        ["bench", "--impl", "x" * 5000, "--seq-len", "256"],
    ],
)
def test_an_error_echoes_at_most_200_characters_of_the_input(args, capsys):
    line = one_error_line(*run_cli(args, capsys)[::2])
    assert "x" * 201 not in line and "9" * 201 not in line
    assert "..." in line and len(line) < 1000


def test_a_huge_key_in_a_config_file_is_cut(tmp_path, capsys):
    path = tmp_path / "opts.yaml"
    path.write_text('plan: {"' + "k" * 900 + '": 1}\n')
    line = one_error_line(*run_cli(["--config", str(path), "plan"], capsys)[::2])
    assert "k" * 201 not in line and "has no option" in line


# --- item 11: profile figures are strict ------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("memory_gib: 23.5", "memory_gib: true", "memory_gib"),
        ("memory_gib: 23.5", "memory_gib: 1.0e+308", "memory_gib"),
        ("memory_gib: 23.5", "memory_gib: 1e308", "memory_gib"),  # YAML 1.1 reads this as text
        ("memory_gib: 23.5", "memory_gib: .inf", "memory_gib"),
        ("memory_gib: 23.5", 'memory_gib: "23.5"', "memory_gib"),
        ("memory_gib: 23.5", "memory_gib: 5000", "memory_gib"),
        ("memory_bandwidth_gb_s: 20", "memory_bandwidth_gb_s: 1.0e+12", "memory_bandwidth_gb_s"),
        ("float32: 0.32", "float32: .nan", "peak_tflops.float32"),
        ("float32: 0.32", "float32: 0", "peak_tflops.float32"),
        ("float32: 0.32", "float32: 1.0e+9", "peak_tflops.float32"),
        ("latency_us: 20", "latency_us: .inf", "intra_node.latency_us"),
        ("attention_compute: 0.25", "attention_compute: true", "efficiency.attention_compute"),
        ("devices_per_node: 1", "devices_per_node: 1.5", "devices_per_node"),
        ("devices_per_node: 1", "devices_per_node: true", "devices_per_node"),
        ("allocator_rounding_bytes: 4096", "allocator_rounding_bytes: 1.0e+20", "allocator_rounding_bytes"),
        ("framework_overhead_gib: 0.0137", "framework_overhead_gib: 30", "framework_overhead_gib"),
        ("name: Generic CPU host", "name: 12", "name"),
    ],
)
def test_profile_figures_are_plain_finite_plausible_numbers(tmp_path, capsys, old, new, field):
    line = one_error_line(*run_cli(["plan", "--profile", profile_with(tmp_path, old, new)], capsys)[::2])
    assert field in line
    if "name" not in field:
        assert "must be" in line  # the error states the range


def test_the_bounds_are_stated_in_the_error(tmp_path, capsys):
    line = one_error_line(
        *run_cli(["plan", "--profile", profile_with(tmp_path, "memory_gib: 23.5", "memory_gib: 9000")], capsys)[::2]
    )
    assert "(0, 4096]" in line and "9000" in line


@pytest.mark.parametrize(
    "old, new",
    [
        ("memory_gib: 23.5", ""),
        ("memory_gib: 23.5", "memory_gib:"),
        ("memory_gib: 23.5", "memory_gib: null"),
    ],
)
def test_a_profile_without_its_memory_figure_is_one_line(tmp_path, capsys, old, new):
    path = profile_with(tmp_path, old, new)
    for args in (
        ["plan", "--profile", path],
        ["plan", "--profile", path, "--max-memory", "2GiB"],
        ["profiles", "validate", path],
        ["profiles", "show", path],
    ):
        assert "memory_gib" in one_error_line(*run_cli(args, capsys)[::2])


def test_a_binary_or_unreadable_profile_is_one_line(tmp_path, capsys):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x01garbage")
    assert "not UTF-8" in one_error_line(*run_cli(["plan", "--profile", str(binary)], capsys)[::2])
    assert "no such shipped profile or file" in one_error_line(
        *run_cli(["plan", "--profile", str(tmp_path)], capsys)[::2]
    )


# --- --config values --------------------------------------------------------------------------------------


def test_config_values_are_read_as_the_command_line_would(tmp_path, capsys):
    ok = tmp_path / "ok.yaml"
    ok.write_text("plan: {seq_len: 4k, segments: [1024, 2048], dilations: [1, 2], heads: 2, head_dim: 16}\n")
    code, out, err = run_cli(["--config", str(ok), "plan"], capsys)
    assert code == 0, err
    boolean = tmp_path / "bool.yaml"
    boolean.write_text("plan: {heads: true}\n")  # was read as 1 head
    assert "heads" in one_error_line(*run_cli(["--config", str(boolean), "plan"], capsys)[::2])
    dtype = tmp_path / "dtype.yaml"
    dtype.write_text("plan: {dtype: float128}\n")
    assert "float128" in one_error_line(*run_cli(["--config", str(dtype), "plan"], capsys)[::2])


def test_config_keys_are_option_names_too_and_a_single_repeat_is_a_list(tmp_path, capsys):
    by_option = (
        tmp_path / "by_option.yaml"
    )  # plan's --world-size is the parameter `devices`; bench's --seq-len `seq_lens`
    by_option.write_text('plan: {world_size: 4, impl: RingDilatedAttention, "--seq-len": 64k}\n')
    code, out, err = run_cli(["--config", str(by_option), "plan"], capsys)
    assert code == 0 and "on 4 x" in out, err
    scalar = tmp_path / "scalar.yaml"  # impl: sdpa (not [sdpa]) was "Value must be an iterable"
    scalar.write_text("bench: {impl: sdpa, seq_len: 256, max_seconds: .nan}\n")
    assert "--max-seconds" in one_error_line(*run_cli(["--config", str(scalar), "bench"], capsys)[::2])


def test_reading_options_does_not_import_torch():
    """--config is read by the app's root callback: its YAML reader must not drag torch into `dattn --version`."""
    import subprocess
    import sys

    code = "import sys, dattn_cli.cli.app; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


def test_a_value_yaml_cannot_construct_names_the_file(tmp_path, capsys):
    path = tmp_path / "opts.yaml"
    path.write_text("plan: {heads: " + "9" * 5000 + "}\n")  # past Python's 4,300-digit int conversion
    line = one_error_line(*run_cli(["--config", str(path), "plan"], capsys)[::2])
    assert str(path) in line and "not valid YAML" in line
