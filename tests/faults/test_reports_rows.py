"""Issue 16, reports read back (items 5 and 6; calibration times from 13; `time_ms` 0 from 15): --resume only
reuses points measured with the same settings; a report line that is not one JSON object, or a row that cannot
be a measurement, is exit 2 naming FILE:LINE for plan --check, plan --calibrate and --baseline; a baseline
that matches nothing does not pass the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dattn_cli.bench import BenchRow, read_rows, run_sweep
from tests.cli.test_verify_env import run_cli
from tests.faults.test_reports import TINY, Runner, one_line_error, sweep

SHIPPED = Path("benchmarks/plan_check_cpu.jsonl")  # single-device attention rows, as plan --check/--calibrate want


# --- 5. resume and the measurement settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, first, then, option",
    [
        ("repeat", 1, 3, "--repeat"),
        ("warmup", 0, 2, "--warmup"),
        ("max_memory", 2**30, 2**31, "--max-memory"),
        ("max_seconds", 60.0, 120.0, "--max-seconds"),
        ("seed", 0, 7, "--seed"),
    ],
)
def test_resume_refuses_points_measured_with_other_settings(tmp_path, setting, first, then, option):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(256, 512, **{setting: first}), out=out, runner=Runner())
    before = out.read_bytes()
    runner = Runner()
    with pytest.raises(ValueError, match=f"measured with {option} {first}, this run {option} {then}"):
        run_sweep(sweep(256, 512, 1024, **{setting: then}), out=out, resume=True, runner=runner)
    assert runner.calls == [] and out.read_bytes() == before  # refused before measuring or writing


def test_resume_refuses_points_measured_with_other_torch_threads(tmp_path):
    out = tmp_path / "r.jsonl"
    first = sweep(256)
    run_sweep(first, out=out, runner=Runner())
    with pytest.raises(ValueError, match="--threads"):
        run_sweep(sweep(256, 512, threads=first.threads + 1), out=out, resume=True, runner=Runner())


def test_rows_record_their_settings_and_the_same_settings_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(256, repeat=2, seed=3), out=out, runner=Runner())
    row = read_rows(out)[0]
    assert (row.repeat, row.warmup, row.seed, row.max_memory, row.threads) == (2, 0, 3, 2**30, sweep(256).threads)
    runner = Runner()
    run_sweep(sweep(256, 512, repeat=2, seed=3), out=out, resume=True, runner=runner)
    assert runner.calls == [512]


def test_other_settings_for_points_this_sweep_does_not_measure_are_no_obstacle(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(4096, repeat=1), out=out, runner=Runner())
    runner = Runner()
    run_sweep(sweep(256, repeat=3), out=out, resume=True, runner=runner)
    assert runner.calls == [256]


def _legacy(path: Path, repeat: int) -> None:
    """A report as older dattn wrote it: rows without settings, the sweep's config in its environment record."""
    rows = [
        r.model_dump(exclude={"repeat", "warmup", "max_memory", "max_seconds", "seed", "threads"})
        for r in run_sweep(sweep(256, 512, repeat=repeat), runner=Runner()).rows
    ]
    env = {
        "record": "environment",
        "config": {"repeat": repeat, "warmup": 0, "max_memory": 2**30, "max_seconds": 120.0, "seed": 0},
    }
    path.write_text("".join(json.dumps(r) + "\n" for r in [env, *rows]))


def test_an_older_report_resumes_with_the_settings_of_its_environment_record(tmp_path):
    out = tmp_path / "r.jsonl"
    _legacy(out, repeat=1)
    with pytest.raises(ValueError, match="--repeat 1, this run --repeat 3"):
        run_sweep(sweep(256, 512, 1024, repeat=3), out=out, resume=True, runner=Runner())
    runner = Runner()
    run_sweep(sweep(256, 512, 1024, repeat=1), out=out, resume=True, runner=runner)
    assert runner.calls == [1024]


def test_cli_resume_with_another_repeat_exits_2_naming_it(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    runner = Runner()
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)
    args = ["bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "256,512", *TINY, "--out", str(out)]
    assert run_cli(args, capsys)[0] == 0
    code, _, err = run_cli([*args, "--resume", "--repeat", "3"], capsys)
    assert code == 2 and "--repeat 1, this run --repeat 3" in one_line_error(err)
    assert runner.calls == [256, 512]


def test_cli_resume_without_max_memory_uses_the_reports_cap(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    runner = Runner()
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)
    args = [
        "bench",
        "--impl",
        "ImprovedDilatedAttention",
        "--seq-len",
        "256,512",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--segments",
        "64,128",
        "--dilations",
        "1,2",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out),
    ]
    assert run_cli([*args, "--max-memory", "1234MiB"], capsys)[0] == 0
    code, _, err = run_cli([*args, "--resume"], capsys)  # the default cap moves with the free memory
    assert code == 0, err
    assert runner.calls == [256, 512]


# --- 6. lines that are JSON but not an object; rows that are not measurements --------------------------------------


def _report(tmp_path: Path, bad: str) -> tuple[Path, int]:
    """A shipped report with `bad` as an extra line in the middle; (path, its line number)."""
    lines = SHIPPED.read_text().splitlines()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([*lines[:3], bad, *lines[3:]]) + "\n")
    return path, 4


NOT_OBJECTS = ["[1, 2]", "42", "null", '"point"', "true"]


@pytest.mark.parametrize("bad", NOT_OBJECTS)
@pytest.mark.parametrize("command", ["--check", "--calibrate"])
def test_plan_reading_a_line_that_is_not_an_object_exits_2_naming_file_and_line(tmp_path, capsys, bad, command):
    path, line = _report(tmp_path, bad)
    code, _, err = run_cli(["plan", command, str(path)], capsys)
    assert code == 2 and f"{path}:{line}:" in one_line_error(err) and "not a JSON object" in err


@pytest.mark.parametrize("bad", ["{not json", b"\xff\xfe garbage".decode("latin-1")])
def test_plan_check_refuses_a_damaged_line_in_the_middle(tmp_path, capsys, bad):
    path, line = _report(tmp_path, bad)
    if bad.startswith("\xff"):  # bytes that are not UTF-8
        path.write_bytes(path.read_bytes().replace(bad.encode(), b"\xff\xfe garbage"))
    code, _, err = run_cli(["plan", "--check", str(path)], capsys)
    assert code == 2 and f"{path}:{line}: not valid JSON" in one_line_error(err)


def test_plan_check_on_a_directory_exits_2(tmp_path, capsys):
    code, _, err = run_cli(["plan", "--check", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in one_line_error(err)


def _point(**changes) -> str:
    row = json.loads(SHIPPED.read_text().splitlines()[1])
    return json.dumps({**row, **changes})


@pytest.mark.parametrize("time_ms", [0, -3.2, float("nan"), float("inf")])
@pytest.mark.parametrize("command", ["--check", "--calibrate"])
def test_plan_refuses_rows_whose_time_is_zero_negative_or_nan(tmp_path, capsys, time_ms, command):
    path, line = _report(tmp_path, _point(time_ms=time_ms))  # json writes NaN and Infinity as Python reads them
    code, _, err = run_cli(["plan", command, str(path)], capsys)
    assert code == 2 and f"{path}:{line}:" in one_line_error(err) and "time_ms" in err
    assert "efficiency" not in err


def test_calibrate_ignores_bad_times_of_rows_built_in_memory():
    from dattn_cli.plan.check import calibrate
    from dattn_cli.plan.profiles import load_profile

    rows = [r for r in read_rows(SHIPPED) if r.target == "attention"]
    bad = [r.model_copy(update={"time_ms": t}) for r in rows for t in (0.0, -1.0, -2.0, float("nan"))]
    fitted = calibrate(rows[:1] + bad, load_profile("cpu-host"), "x").efficiency.per_impl
    assert fitted == calibrate(rows[:1], load_profile("cpu-host"), "x").efficiency.per_impl
    assert all(0 < v <= 1 for v in fitted.values())


# --- 6. the baseline -----------------------------------------------------------------------------------------------


@pytest.fixture
def gate(tmp_path, capsys, monkeypatch):
    """bench N=256,512 against `baseline` (written from lines) with a scripted runner: (code, stderr, runner)."""
    runner = Runner()
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)

    def run(lines: list[str]):
        baseline = tmp_path / "base.jsonl"
        baseline.write_text("".join(line + "\n" for line in lines))
        code, _, err = run_cli(
            [
                "bench",
                "--impl",
                "ImprovedDilatedAttention",
                "--seq-len",
                "256,512",
                *TINY,
                "--baseline",
                str(baseline),
                "--fail-on-regression",
                "10",
            ],
            capsys,
        )
        return code, err, runner

    return run


def _rows(*lengths: int, **changes) -> list[str]:
    rows = run_sweep(sweep(*lengths, mode="fwdbwd"), runner=Runner()).rows  # bench's default mode
    return [json.dumps({**r.model_dump(), **changes}) for r in rows]


@pytest.mark.parametrize("bad", NOT_OBJECTS)
def test_a_baseline_line_that_is_not_an_object_exits_2_before_measuring(gate, bad):
    code, err, runner = gate([*_rows(256, 512), bad])
    assert code == 2 and ":3: " in one_line_error(err) and "not a JSON object" in err and runner.calls == []


@pytest.mark.parametrize("time_ms", [0, -1.0])
def test_a_baseline_row_with_a_zero_or_negative_time_exits_2_before_measuring(gate, time_ms):
    code, err, runner = gate(_rows(256, 512, time_ms=time_ms))
    assert code == 2 and ":1: " in one_line_error(err) and "time_ms" in err and runner.calls == []


@pytest.mark.parametrize("lines", [[], ['{"record": "environment"}']])
def test_an_empty_baseline_exits_2(gate, lines):
    code, err, runner = gate(lines)
    assert code == 2 and "--baseline" in one_line_error(err) and runner.calls == []


def test_a_baseline_with_no_point_matching_the_sweep_does_not_pass(gate):
    code, err, runner = gate(_rows(4096, 8192))
    assert code == 2 and "baseline has no point matching this sweep" in one_line_error(err)


class SampledRunner(Runner):
    """ok rows with 8 timed samples around the usual time: what the gate's statistics need."""

    def __call__(self, sweep, problem):
        result = super().__call__(sweep, problem)
        samples = [result["time_ms"] * (1 + 0.01 * i) for i in range(8)]
        return {**result, "samples_ms": samples, "repeats": len(samples)}


def test_a_matching_baseline_still_gates(gate, monkeypatch):
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", SampledRunner())
    base = [json.loads(line) for line in _rows(256, 512)]
    for row in base:
        row.update(samples_ms=[row["time_ms"] * (1 + 0.01 * i) for i in range(8)], repeats=8)
    halved = [{**row, "time_ms": row["time_ms"] / 2, "samples_ms": [t / 2 for t in row["samples_ms"]]} for row in base]
    code, err, _ = gate([json.dumps(row) for row in halved])
    assert code == 1, err
    code, err, _ = gate([json.dumps(row) for row in base])
    assert code == 0, err


def test_a_row_time_of_zero_in_a_report_is_no_traceback(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(SHIPPED.read_text().splitlines()[0] + "\n" + _point(time_ms=0) + "\n")
    for command in ("--check", "--calibrate"):
        code, _, err = run_cli(["plan", command, str(path)], capsys)
        assert code == 2 and f"{path}:2: not a measurement: time_ms" in one_line_error(err)
    with pytest.raises(ValueError, match="time_ms"):
        read_rows(path)
    assert BenchRow.model_validate(json.loads(_point(time_ms=0))).time_ms == 0  # a row in memory is not refused


def test_a_report_that_cannot_be_read_exits_2_naming_it(capsys):
    # a regular file whose read fails (EIO), as an unreadable or damaged report would
    code, _, err = run_cli(["plan", "--check", "/proc/self/mem"], capsys)
    assert code == 2 and "/proc/self/mem: cannot read it" in one_line_error(err)
