"""Issue 16, inputs (items 12-15): user text through rich prints literally; numeric options are finite and
bounded, refused naming the parameter; a verify that checked nothing fails; the solvers say when they hit
their search cap; a non-finite figure never reaches a table; huge world sizes are refused before anything
is spawned. Each bad input: one line on stderr, exit 2, no traceback. Tiny shapes; nothing timing-sensitive."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from dattn_cli.plan.profiles import shipped_profiles
from tests.cli.test_verify_env import run_cli

TINY = ["--seq-len", "256", "--heads", "2", "--head-dim", "16", "--segments", "64,128", "--dilations", "1,2"]
BENCH = [
    "bench",
    "--impl",
    "sdpa",
    *TINY,
    "--repeat",
    "1",
    "--warmup",
    "0",
    "--max-memory",
    "1GiB",
    "--max-seconds",
    "5",
]
MARKUP = "[/bold] x [red]"


def error_line(code: int, err: str) -> str:
    """The one 'dattn: error:' line of an exit-2 run (notes aside)."""
    lines = [line for line in err.splitlines() if not line.startswith("dattn: note")]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("dattn: error: "), err[-2000:]
    return lines[0]


def markup_profile(tmp_path: Path, name: str = MARKUP) -> str:
    path = tmp_path / "markup.yaml"
    path.write_text(shipped_profiles()["cpu-host"].read_text().replace("name: Generic CPU host", f'name: "{name}"'))
    return str(path)


def rendered(renderable) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(renderable)
    return buffer.getvalue()


# --- item 12: user text is never markup -------------------------------------------------------------------


def test_a_profile_name_with_markup_prints_as_written(tmp_path, capsys):
    path = markup_profile(tmp_path)
    code, out, err = run_cli(["plan", "--profile", path, "--seq-len", "4k"], capsys)
    assert code == 0, err
    assert MARKUP in out
    code, out, err = run_cli(["profiles", "validate", path], capsys)
    assert code == 0 and MARKUP in out, err


def test_a_path_with_markup_in_a_note_prints_as_written(tmp_path, capsys):
    (tmp_path / "[").mkdir()
    plot = tmp_path / "[/bold]plot.png"  # the file bold]plot.png in the folder "["
    code, out, err = run_cli([*BENCH, "--plot", str(plot)], capsys)
    assert code == 0, err
    assert f"plot written to {plot}" in err


def test_an_error_message_with_markup_in_a_verify_table_prints_as_written():
    from dattn_cli.cli.render.verify import verify_summary, verify_table
    from dattn_cli.verify.report import CaseResult, VerifyReport

    result = CaseResult.model_construct(
        impl="[/bold]Plugin",
        case="[red]case",
        semantics="longnet",
        causal=False,
        backend="auto",
        dtype="float32",
        pattern=None,
        world_size=1,
        errors={},
        passed=False,
        message="RuntimeError: [/bold] closed",
        batch=1,
        seq_len=256,
        heads=2,
        head_dim=16,
        segment_lengths=[64],
        dilation_rates=[1],
        uncovered_fraction=0.0,
    )
    report = VerifyReport.model_construct(results=[result], passed=False, seed=0, skipped=[])
    text = rendered(verify_table(report, details=True)) + rendered(verify_summary(report))
    assert "[/bold]" in text and "[red]case" in text


def test_notes_print_literally(capsys):
    from dattn_cli.cli.render.common import note

    note("written to out/[/bold]/x.png")
    assert "[/bold]" in capsys.readouterr().err


@pytest.mark.slow
def test_a_unicode_name_on_an_ascii_terminal_prints(tmp_path):
    path = markup_profile(tmp_path, "Ünïcödé € 😀 [/bold]")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "profiles", "validate", path],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "[/bold]" in done.stdout


# --- item 13: numeric options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, parameter",
    [
        ([*BENCH, "--max-seconds", "nan"], "--max-seconds"),
        ([*BENCH, "--max-seconds", "inf"], "--max-seconds"),
        ([*BENCH, "--max-seconds", "-1"], "--max-seconds"),
        ([*BENCH, "--max-seconds", "1e300"], "--max-seconds"),
        ([*BENCH, "--dist-timeout", "nan"], "--dist-timeout"),
        ([*BENCH, "--warmup", str(10**20)], "--warmup"),
        ([*BENCH, "--repeat", str(10**20)], "--repeat"),
        ([*BENCH, "--seed", str(10**20)], "--seed"),
        ([*BENCH, "--fail-on-regression", "nan", "--baseline", "missing.jsonl"], "--fail-on-regression"),
        ([*BENCH, "--max-memory", "9" * 400], "--max-memory"),
        (
            [
                "bench",
                "--impl",
                "BlockSparseRingDilatedAttention",
                *TINY[:-4],
                "--segments",
                "64,128",
                "--dilations",
                "1,2",
                "--pattern",
                "local",
                "--window",
                str(10**20),
                "--repeat",
                "1",
                "--warmup",
                "0",
            ],
            "--window",
        ),
        (["plan", "--heads", "0"], "--heads"),
        (["plan", "--heads", "-4"], "--heads"),
        (["plan", "--batch", str(10**12)], "--batch"),
        (["plan", "--seq-len", str(10**30)], "--seq-len"),
        (["plan", "--seq-len", "4k,8k"], "--seq-len"),
        (["plan", "--max-memory", "9" * 400], "--max-memory"),
        (["plan", "--target", "model", "--layers", str(10**9)], "--layers"),
        (["verify", "--impl", "DilatedAttention", *TINY, "--seed", str(10**20)], "--seed"),
        (["verify", "--impl", "DilatedAttention", *TINY, "--dist-timeout", "nan"], "--dist-timeout"),
        (["verify", "--seq-len", str(10**30)], "--seq-len"),
        (["profile", *TINY, "--iterations", "1", "--seed", str(10**20)], "--seed"),
    ],
)
def test_bad_numbers_are_refused_naming_the_parameter(args, parameter, capsys):
    assert parameter in error_line(*run_cli(args, capsys)[::2])


def test_a_huge_iteration_count_is_refused_not_run():
    """It ran (for ever) before: refused at once now."""
    done = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "profile", *TINY, "--iterations", str(10**20)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--iterations" in done.stderr, done.stderr[-2000:]


# --- item 14: nothing checked, search caps, non-finite figures --------------------------------------------


def test_a_verify_that_ran_no_check_is_an_error():
    from dattn_cli.verify import own_cases
    from dattn_cli.verify.run import collect_checks, run_checks

    cases = own_cases([256], heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2])
    checks = collect_checks(["DilatedAttention"], cases=cases, semantics=["longnet"], causal=[False])
    with pytest.raises(ValueError, match="ran no check"):
        run_checks(dataclasses.replace(checks, single=[], groups=[]))


def test_verify_with_more_ranks_than_any_case_takes_exits_2(capsys):
    line = error_line(*run_cli(["verify", "--world-size", "1000"], capsys)[::2])
    assert "--world-size" in line or "nothing to check" in line


def test_max_seq_at_its_search_cap_reports_no_bound(capsys):
    code, out, err = run_cli(
        [
            "plan",
            "--max-seq",
            "--max-memory",
            "1000000TiB",
            "--heads",
            "1",
            "--head-dim",
            "2",
            "--segments",
            "2",
            "--dilations",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    assert "no bound found up to N=1,099,511,627,776" in " ".join(out.split())
    assert "largest N that fits" not in out


def test_min_devices_that_finds_none_says_so(capsys):
    code, out, err = run_cli(
        ["plan", "--min-devices", "--impl", "RingDilatedAttention", "--seq-len", "64k", "--max-memory", "1KiB"], capsys
    )
    assert code == 0, err
    assert "no bound found" in out


def test_a_non_finite_figure_never_reaches_a_table():
    from dattn_cli.cli.render.common import num, size
    from dattn_cli.cli.render.plan import plan_table
    from dattn_cli.plan.profiles import load_profile
    from dattn_cli.plan.solve import plan
    from dattn_cli.workload import Problem

    assert size(float("inf")) == size(float("nan")) == size(-1) == num(float("nan")) == "n/a"
    result = plan(
        Problem(seq_len=256, heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2]),
        load_profile("cpu-host"),
    )
    broken = result.time.model_copy(update={"total_s": float("inf"), "compute_s": float("nan")})
    text = rendered(plan_table(result.model_copy(update={"time": broken}), None, "-"))
    assert "inf" not in text.replace("infeasible", "") and "nan" not in text and "n/a" in text


# --- item 15: dtype strings, huge world sizes -------------------------------------------------------------


@pytest.mark.parametrize("command", [["plan"], BENCH, ["verify", *TINY], ["profile", *TINY]])
def test_a_float128_dtype_is_one_line(command, capsys):
    assert "--dtype" in error_line(*run_cli([*command, "--dtype", "float128"], capsys)[::2])


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--impl", "RingDilatedAttention", "--world-size", str(10**12)],
        ["plan", "--impl", "RingDilatedAttention", "--world-size", "100000"],
        ["bench", "--impl", "RingDilatedAttention", *TINY, "--world-size", str(10**12)],
        ["bench", "--impl", "RingDilatedAttention", *TINY, "--world-size", "100", "--repeat", "1", "--warmup", "0"],
        ["verify", "--world-size", str(10**12)],
    ],
)
def test_a_huge_world_size_is_one_line(args, capsys):
    assert "--world-size" in error_line(*run_cli(args, capsys)[::2])


def test_spawned_runs_are_bounded_before_anything_is_spawned():
    from dattn_cli.bench import Sweep
    from dattn_cli.runtime.limits import max_spawned_ranks
    from dattn_cli.verify import own_cases
    from dattn_cli.verify.run import collect_checks

    too_many = max_spawned_ranks() * 2
    with pytest.raises(ValueError, match="ranks are spawned"):
        Sweep(
            impls=["RingDilatedAttention"],
            seq_lens=[1 << 16],
            heads=2,
            head_dim=16,
            segment_lengths=[64],
            dilation_rates=[1],
            world_size=too_many,
            max_memory=2**30,
        )
    cases = own_cases([1 << 16], heads=2, head_dim=16, segment_lengths=[64], dilation_rates=[1])
    with pytest.raises(ValueError, match="ranks are spawned"):  # collected (and later spawned) before
        collect_checks(
            ["RingDilatedAttention"], world_sizes=[too_many], cases=cases, semantics=["longnet"], causal=[False]
        )


def test_verify_refuses_a_baseline_instead_of_failing_on_it(capsys):
    assert "baseline" in error_line(*run_cli(["verify", "--impl", "sdpa", *TINY], capsys)[::2])


def test_a_command_group_without_its_command_prints_its_help(capsys):
    code, out, err = run_cli(["profiles"], capsys)  # IndexError on an empty usage message before
    assert code == 0 and "list" in out and "validate" in out, err


@pytest.mark.parametrize("command", [["impls"], ["env"]])
def test_an_output_file_that_cannot_be_written_is_one_line(command, tmp_path, capsys):
    line = error_line(*run_cli([*command, "--json", str(tmp_path / "missing" / "out.json")], capsys)[::2])
    assert "cannot write" in line


def test_a_huge_dilation_rate_is_planned_without_looping_over_it():
    """head_sets looped over range(rate): rates up to 2**33 hung plan; it now loops over min(rate, heads)."""
    segments = ",".join(str(2**i) for i in range(6, 40))
    dilations = ",".join(str(2**i) for i in range(34))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dattn_cli",
            "plan",
            "--segments",
            segments,
            "--dilations",
            dilations,
            "--seq-len",
            "1048576m",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_pattern_of_too_many_pairs_is_one_line(capsys):
    many = ",".join(["64"] * 65)
    assert "--segments" in error_line(*run_cli(["plan", "--segments", many, "--dilations", many], capsys)[::2])


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "--impl", "DilatedAttention", "--segments", "2048", "--dilations", "1"],
        ["profile", "--segments", "2048", "--dilations", "1", "--iterations", "1", "--warmup", "0"],
    ],
)
def test_a_problem_far_beyond_this_machines_memory_is_refused_up_front(command, capsys):
    """Both run in this process: an allocation of terabytes failed halfway, with a torch traceback."""
    line = error_line(*run_cli([*command, "--seq-len", "1048576m"], capsys)[::2])
    assert "--seq-len" in line and "GiB" in line


@pytest.mark.parametrize(
    "args",
    [
        [
            "bench",
            "--impl",
            "BlockSparseRingDilatedAttention",
            "--seq-len",
            "1048576m",
            "--block-size",
            "1",
            "--repeat",
            "1",
            "--warmup",
            "0",
        ],
        [
            "profile",
            "--impl",
            "BlockSparseRingDilatedAttention",
            "--seq-len",
            "64m",
            "--heads",
            "1",
            "--head-dim",
            "1",
            "--segments",
            "2048",
            "--dilations",
            "1",
            "--iterations",
            "1",
            "--warmup",
            "0",
        ],
    ],
)
def test_a_block_table_too_large_to_build_is_one_line(args, capsys):
    """The (N / block size)**2 block table: torch's 'Storage size calculation overflowed' before."""
    assert "--block-size" in error_line(*run_cli(args, capsys)[::2])


@pytest.mark.parametrize(
    "module, words", [("no_such_dattn_plugin", "cannot import"), ("broken_plugin", "RuntimeError")]
)
def test_a_plugin_that_cannot_be_imported_is_one_line(module, words, tmp_path):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('[/bold] broken on import')\n")
    env = {
        **os.environ,
        "DATTN_PLUGINS": module,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "impls"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "DATTN_PLUGINS" in done.stderr and words in done.stderr


@pytest.mark.parametrize("trace", ["", ".", "TMP"])
def test_a_trace_that_names_a_directory_is_refused(trace, tmp_path, capsys):
    """The profiler failed to write it (a C++ log line) and the report still named it as the trace."""
    trace = str(tmp_path) if trace == "TMP" else trace
    args = ["profile", *TINY, "--iterations", "1", "--warmup", "0", "--trace", trace]
    assert "--trace" in error_line(*run_cli(args, capsys)[::2])
