"""The CLI: verify's exit codes, JSON report, bad input handling, env."""

import json
import subprocess
import sys

import pytest
import torch

from dattn_cli.cli import main
from dattn_cli.kernels import DilatedAttention, ImplSpec, registry as registry_module


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


class WrongAttention(DilatedAttention):
    """Deliberately wrong: drops the softmax scale."""

    def forward_with_lse(self, q, k, v, is_causal=False, *, key_padding_mask=None):
        out, lse = super().forward_with_lse(q * 1.5, k, v, is_causal, key_padding_mask=key_padding_mask)
        return out, lse


@pytest.mark.slow
def test_verify_quick_passes_and_writes_json(tmp_path, capsys):
    report = tmp_path / "v.json"
    code, out, err = run_cli(["verify", "--quick", "--impl", "ImprovedDilatedAttention", "--json", str(report)], capsys)
    assert code == 0, out + err
    assert "verify passed" in out
    data = json.loads(report.read_text())
    assert data["passed"] and len(data["results"]) == 36  # 9 cases x 2 semantics x 2 causal
    row = data["results"][0]
    assert {"out", "lse", "dq", "dk", "dv"} <= row["errors"].keys()
    assert row["errors"]["out"]["rel"] < 1e-5
    assert data["environment"]["torch_version"] == torch.__version__ and data["environment"]["command"][0] == "dattn"


@pytest.mark.slow
def test_verify_fails_with_exit_1_on_a_wrong_implementation(monkeypatch, capsys):
    monkeypatch.setitem(
        registry_module.REGISTRY,
        "WrongAttention",
        ImplSpec("WrongAttention", WrongAttention, "core", "single", "wrong on purpose"),
    )
    code, out, err = run_cli(
        ["verify", "--impl", "WrongAttention", "--impl", "DilatedAttention", "--no-causal"], capsys
    )
    assert code == 1
    assert "verify FAILED" in out and "WrongAttention" in out


def test_verify_reports_crashing_implementation_as_failure(monkeypatch, capsys):
    class Crashing(DilatedAttention):
        def forward_with_lse(self, *a, **k):
            raise RuntimeError("boom")

    monkeypatch.setitem(
        registry_module.REGISTRY, "Crashing", ImplSpec("Crashing", Crashing, "core", "single", "crashes")
    )
    code, out, _ = run_cli(["verify", "--impl", "Crashing", "--causal", "--semantics", "longnet"], capsys)
    assert code == 1 and "boom" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["verify", "--impl", "Nope"], "--impl 'Nope' is not registered"),
        (["verify", "--dtype", "int8"], "Invalid value for '--dtype'"),
        (["verify", "--both", "--causal"], "--both conflicts"),
        (["verify", "--backend", "flash"], "backend 'flash' cannot run on cpu"),
        (["verify", "--device", "tpu"], "--device 'tpu'"),
        (["verify", "--bogus"], "No such option: --bogus"),
    ],
)
def test_bad_usage_is_one_line_exit_2(args, needle, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


@pytest.mark.slow
def test_config_file(tmp_path, capsys):
    good = tmp_path / "c.yaml"
    good.write_text("verify:\n  impl: [DilatedAttention]\n  semantics: longnet\n  causal: true\n")
    code, out, _ = run_cli(["--config", str(good), "verify"], capsys)
    assert code == 0 and "verify passed: 9 checks" in out  # 9 cases x longnet only x causal only
    for text, needle in [
        ("verify: [1, 2\n", "not valid YAML"),
        ("verify:\n  nope: 1\n", "has no option 'nope'"),
        ("nonsense: {}\n", "unknown command 'nonsense'"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        code, _, err = run_cli(["--config", str(bad), "verify"], capsys)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_env_runs_without_gpu(tmp_path, capsys):
    code, out, err = run_cli(["env", "--json", "-"], capsys)
    assert code == 0
    info = json.loads(out)  # JSON alone on stdout; the table went to stderr
    assert "torch" in err
    code, _, _ = run_cli(["env", "--json", str(tmp_path / "env.json")], capsys)
    assert code == 0 and json.loads((tmp_path / "env.json").read_text())["torch_version"] == info["torch_version"]
    assert info["torch_version"] == torch.__version__
    if not torch.cuda.is_available():
        assert info["nvidia_devices"] == [] and (
            "no NVIDIA device" in info["nvml_status"] or "not installed" in info["nvml_status"]
        )
    assert info["backends"]["math"] and info["backends"]["sdpa"]


OWN = ["--seq-len", "64", "--segments", "16,32", "--dilations", "1,2", "--heads", "2", "--head-dim", "8"]


def test_verify_checks_your_configuration_on_every_implementation(tmp_path, capsys):
    report = tmp_path / "v.json"
    code, out, err = run_cli(["verify", *OWN, "--json", str(report)], capsys)
    assert code == 0, out + err
    data = json.loads(report.read_text())
    rows = data["results"]
    assert {r["case"] for r in rows} == {"your configuration"}
    assert {(r["seq_len"], r["heads"], r["head_dim"], r["batch"]) for r in rows} == {(64, 2, 8, 1)}
    assert {(tuple(r["segment_lengths"]), tuple(r["dilation_rates"])) for r in rows} == {((16, 32), (1, 2))}
    expected = registry_module.names(lambda s: not s.baseline and s.single_device)
    assert sorted({r["impl"] for r in rows}) == sorted(expected)
    assert {r["pattern"] for r in rows if r["pattern"]} == {"dilated", "longnet"}  # the patterns built from it
    assert {(r["semantics"], r["causal"]) for r in rows} == {("longnet", False)}  # as bench, plan, profile default
    assert "verify passed: 8 checks of B=1 N=64 H=2 D=8, segments 16,32, dilations 1,2, longnet, non-causal" in out
    code, out, err = run_cli(
        ["verify", *OWN, "--impl", "DilatedAttention", "--semantics", "both", "--both", "--json", str(report)], capsys
    )
    assert code == 0, out + err
    rows = json.loads(report.read_text())["results"]
    assert {(r["semantics"], r["causal"]) for r in rows} == {(s, c) for s in ("longnet", "head_groups") for c in (0, 1)}


def test_verify_your_configuration_says_what_it_skips_and_warns(tmp_path, capsys):
    report = tmp_path / "v.json"
    args = [
        "verify",
        "--seq-len",
        "96",
        "--segments",
        "16,32,64",
        "--dilations",
        "1,2,3",
        "--heads",
        "2",
        "--head-dim",
        "8",
        "--impl",
        "ImprovedDilatedAttention",
        "--semantics",
        "both",
        "--json",
        str(report),
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, out + err
    assert "skipped: case 'your configuration', head_groups: 2 heads < 3 pairs" in err
    data = json.loads(report.read_text())
    assert {r["semantics"] for r in data["results"]} == {"longnet"} and len(data["skipped"]) == 1
    # head_groups with one head per pair leaves rows no pair keeps: news for this configuration, so a warning
    code, _, err = run_cli(["verify", *OWN, "--impl", "ImprovedDilatedAttention", "--semantics", "head_groups"], capsys)
    assert code == 0 and "warning: case 'your configuration' (head_groups): 25% of (position, head) rows" in err
    code, _, err = run_cli([*args[:-4], "--semantics", "head_groups"], capsys)
    assert code == 2 and "nothing to check: case 'your configuration', head_groups: 2 heads < 3 pairs" in err


def test_verify_your_configuration_names_shard_rules(capsys):
    # N/p and the segments no longer refuse a case (the sequence is padded); heads that do not split still do
    code, _, err = run_cli(
        [
            "verify",
            "--seq-len",
            "100",
            "--segments",
            "32,64",
            "--dilations",
            "1,2",
            "--heads",
            "3",
            "--impl",
            "HeadParallelDilatedAttention",
            "--world-size",
            "2",
        ],
        capsys,
    )
    assert code == 2
    assert (
        "nothing to check: HeadParallelDilatedAttention p=2, case 'your configuration': 3 heads are not divisible"
        in err
    )


@pytest.mark.slow
def test_builtin_matrix_keeps_its_uncovered_rows_out_of_the_output(tmp_path, capsys):
    report = tmp_path / "v.json"
    args = ["verify", "--impl", "ImprovedDilatedAttention", "--semantics", "head_groups", "--causal"]
    code, out, err = run_cli([*args, "--json", str(report)], capsys)
    assert code == 0 and "kept by no pair" not in out + err
    assert any(r["uncovered_fraction"] > 0 for r in json.loads(report.read_text())["results"])
    code, out, err = run_cli([*args, "--details"], capsys)
    assert code == 0 and "warning: case 'ragged groups, r ∤ N/p' (head_groups)" in err


def test_verify_progress_one_line_per_check_and_quiet(capsys):
    args = ["verify", *OWN, "--impl", "ImprovedDilatedAttention", "--both"]
    code, out, err = run_cli(args, capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert lines == [
        "[1/2] ImprovedDilatedAttention 'your configuration' longnet non-causal ok",
        "[2/2] ImprovedDilatedAttention 'your configuration' longnet causal ok",
    ]
    code, out, err = run_cli([*args, "--quiet"], capsys)
    assert code == 0 and "[1/2]" not in err and "verify passed: 2 checks" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--full"], "--full checks the built-in case matrix; drop it"),
        (["--segments", "16,x"], "--segments: '16,x' is not a comma-separated list"),
        (["--heads", "0"], "--heads must be >= 1"),
        (["--seq-len", "4q"], "--seq-len: '4q' is not a length"),
    ],
)
def test_verify_your_configuration_bad_input_is_one_line(args, needle, capsys):
    code, _, err = run_cli(["verify", "--seq-len", "64", *args], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="flash may run here")
def test_verify_refuses_an_implementation_that_cannot_run_here(capsys):
    code, _, err = run_cli(["verify", "--impl", "flash"], capsys)
    assert code == 2 and "--impl flash cannot run here: runs on cuda only" in err


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "dattn_cli", "env"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "torch" in result.stdout
