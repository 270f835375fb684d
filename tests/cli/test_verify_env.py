"""The CLI: verify's exit codes, JSON report, bad input handling, env."""

import json
import subprocess
import sys

import pytest
import torch

from dattn_cli.cli import main
from dattn_cli.kernels import DilatedAttention, ImplSpec
from dattn_cli.kernels import registry as registry_module


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


def test_verify_quick_passes_and_writes_json(tmp_path, capsys):
    report = tmp_path / "v.json"
    code, out, err = run_cli(["verify", "--quick", "--impl", "ImprovedDilatedAttention", "--json", str(report)], capsys)
    assert code == 0, out + err
    assert "verify passed" in out
    data = json.loads(report.read_text())
    assert data["passed"] and len(data["results"]) == 28  # 7 cases x 2 semantics x 2 causal
    row = data["results"][0]
    assert {"out", "lse", "dq", "dk", "dv"} <= row["errors"].keys()
    assert row["errors"]["out"]["rel"] < 1e-5
    assert data["environment"]["torch_version"] == torch.__version__ and data["environment"]["command"][0] == "dattn"


def test_verify_fails_with_exit_1_on_a_wrong_implementation(monkeypatch, capsys):
    monkeypatch.setitem(registry_module.REGISTRY, "WrongAttention", ImplSpec("WrongAttention", WrongAttention, "core", "single", "wrong on purpose"))
    code, out, err = run_cli(["verify", "--impl", "WrongAttention", "--impl", "DilatedAttention", "--no-causal"], capsys)
    assert code == 1
    assert "verify FAILED" in out and "WrongAttention" in out


def test_verify_reports_crashing_implementation_as_failure(monkeypatch, capsys):
    class Crashing(DilatedAttention):
        def forward_with_lse(self, *a, **k):
            raise RuntimeError("boom")

    monkeypatch.setitem(registry_module.REGISTRY, "Crashing", ImplSpec("Crashing", Crashing, "core", "single", "crashes"))
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


def test_config_file(tmp_path, capsys):
    good = tmp_path / "c.yaml"
    good.write_text("verify:\n  impl: [DilatedAttention]\n  semantics: longnet\n  causal: true\n")
    code, out, _ = run_cli(["--config", str(good), "verify"], capsys)
    assert code == 0 and "verify passed: 7 checks" in out  # 7 cases x longnet only x causal only
    for text, needle in [("verify: [1, 2\n", "not valid YAML"), ("verify:\n  nope: 1\n", "has no option 'nope'"),
                         ("nonsense: {}\n", "unknown command 'nonsense'")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        code, _, err = run_cli(["--config", str(bad), "verify"], capsys)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_env_runs_without_gpu(capsys):
    code, out, err = run_cli(["env", "--json", "-"], capsys)
    assert code == 0
    info = json.loads(out)  # JSON alone on stdout; the table went to stderr
    assert "torch" in err
    assert info["torch_version"] == torch.__version__
    if not torch.cuda.is_available():
        assert info["nvidia_devices"] == [] and ("no NVIDIA device" in info["nvml_status"] or "not installed" in info["nvml_status"])
    assert info["backends"]["math"] and info["backends"]["sdpa"]


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "dattn_cli", "env"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "torch" in result.stdout
