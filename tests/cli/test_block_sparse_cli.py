"""Block-sparse from the command line: verify and bench carry the pattern as a column, --plot-x density
fits time against density, profile reports the pattern and draws it."""

import json

import pytest

from dattn_cli.bench import read_rows
from tests.cli.test_verify_env import run_cli

IMPL = "BlockSparseRingDilatedAttention"


@pytest.mark.slow
def test_verify_checks_every_pattern(tmp_path, capsys):
    report = tmp_path / "v.json"
    code, out, err = run_cli(["verify", "--impl", IMPL, "--no-causal", "--json", str(report)], capsys)
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert {r["pattern"] for r in data["results"]} == {
        "local",
        "dilated",
        "global_local",
        "hierarchical",
        "longnet",
        "sliding_window",
    }
    assert "hierarchical" in out and data["passed"]


def test_verify_pattern_option_selects_patterns(capsys):
    code, out, _ = run_cli(
        ["verify", "--impl", IMPL, "--pattern", "local", "--no-causal", "--semantics", "longnet", "--details"], capsys
    )
    assert code == 0 and "local" in out and "hierarchical" not in out


def test_bench_density_sweep_rows_and_density_plot(tmp_path, capsys):
    out, plot = tmp_path / "r.jsonl", tmp_path / "d.png"
    code, stdout, err = run_cli(
        [
            "bench",
            "--impl",
            IMPL,
            "--impl",
            "sdpa",
            "--seq-len",
            "1k",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--repeat",
            "2",
            "--pattern",
            "local",
            "--block-size",
            "64",
            "--density",
            "0.1,0.3",
            "--out",
            str(out),
            "--plot",
            str(plot),
        ],
        capsys,
    )
    assert code == 0, err
    rows = read_rows(out)
    sparse = [r for r in rows if r.impl == IMPL]
    assert [r.pattern for r in sparse] == ["local(d=0.1,b=64)", "local(d=0.3,b=64)"]
    assert sparse[0].element_density < sparse[1].element_density
    assert sparse[0].flops < sparse[1].flops < next(r for r in rows if r.impl == "sdpa").flops
    assert "pattern" in stdout and "local(d=0.1,b=64)" in stdout
    assert plot.stat().st_size > 0 and "x density" in err


def test_bad_pattern_options_are_one_line_exit_2(capsys):
    for args, needle in (
        (["--pattern", "spiral"], "pattern='spiral' is unknown"),
        (["--pattern", "dilated", "--density", "0.1"], "takes no density"),
        (["--density", "0.1,x", "--pattern", "local"], "--density"),
        (["--executor", "fast"], "executor"),
        (["--pattern", "dilated", "--window", "2"], "takes no window"),
    ):
        code, _, err = run_cli(["bench", "--impl", IMPL, "--seq-len", "1k", *args], capsys)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_profile_reports_the_pattern_and_draws_it(tmp_path, capsys):
    png, js = tmp_path / "pattern.png", tmp_path / "p.json"
    code, stdout, err = run_cli(
        [
            "profile",
            "--impl",
            IMPL,
            "--pattern",
            "global_local",
            "--window",
            "1",
            "--block-size",
            "32",
            "--seq-len",
            "512",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--iterations",
            "2",
            "--show-pattern",
            str(png),
            "--json",
            str(js),
        ],
        capsys,
    )
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG" and "16 x 16 blocks" in err
    report = json.loads(js.read_text())["block_pattern"]
    assert report["label"] == "global_local(w=1,g=1,b=32)" and 0 < report["block_density"] < 1
    assert report["cached_bytes"] >= report["block_table_bytes"] == 256
    assert "block pattern" in stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["profile", "--show-pattern", "x.png"], "block-sparse implementations only"),
        (["profile", "--impl", IMPL, "--pattern", "local", "--density", "2"], "density must be in (0, 1]"),
    ],
)
def test_profile_pattern_usage_errors(args, needle, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
