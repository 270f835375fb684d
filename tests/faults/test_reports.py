"""Issue 16, reports and files (items 1-4): a torn last line, two writers, an output over the report, an --out
that cannot hold a report, a disk that fills up mid sweep. Sweeps use a scripted runner (no workers) or tiny
shapes; nothing here is timing-sensitive."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dattn_cli.bench import Sweep, read_rows, run_sweep
from tests.cli.test_verify_env import run_cli

BASE = dict(
    heads=2, head_dim=16, segment_lengths=[64, 128], dilation_rates=[1, 2], max_memory=2**30, repeat=1, warmup=0
)
TINY = [
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
    "--max-memory",
    "1GiB",
]


def ok_result(n: int) -> dict:
    return {
        "status": "ok",
        "time_ms": n / 100,
        "time_ms_p10": n / 110,
        "time_ms_p90": n / 90,
        "repeats": 1,
        "tokens_per_s": 1e5,
        "flops": 1.0,
        "tflops": 1e-6,
        "peak_mem_bytes": 1000 * n,
    }


class Runner:
    def __init__(self):
        self.calls = []

    def __call__(self, sweep, problem):
        self.calls.append(problem.seq_len)
        return ok_result(problem.seq_len)


def sweep(*lengths: int, **settings) -> Sweep:
    return Sweep(impls=["ImprovedDilatedAttention"], seq_lens=list(lengths), **{**BASE, **settings})


def assert_whole_lines(path: Path) -> list[dict]:
    """Every line of the report is one JSON object and the file ends with a newline."""
    text = path.read_text()
    assert text.endswith("\n"), repr(text[-80:])
    records = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(r, dict) for r in records)
    return records


def dattn(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dattn_cli", *args], capture_output=True, text=True, **kwargs)


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("dattn: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


# --- 1. a torn last line -------------------------------------------------------------------------------------------


def killed(out: Path) -> str:
    """The report as a run killed after its last point leaves it: without the closing run_end record."""
    return "".join(line for line in out.read_text().splitlines(True) if '"run_end"' not in line)


def test_resume_removes_a_torn_last_line_and_measures_that_point_again(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(256, 512), out=out, runner=Runner())
    text = killed(out)
    out.write_text(text[: len(text) - 40])  # the last row cut off mid-line, as a killed write leaves it
    runner = Runner()
    result = run_sweep(sweep(256, 512, 1024), out=out, resume=True, runner=runner)
    assert runner.calls == [512, 1024]  # 512 measured again, 256 kept
    records = assert_whole_lines(out)
    assert [r["seq_len"] for r in records if r["record"] == "point"] == [256, 512, 1024]
    assert [r.seq_len for r in result.rows] == [256, 512, 1024]
    assert "last line was cut off" in capsys.readouterr().err


def test_resume_keeps_a_whole_last_row_that_lost_only_its_newline(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(256, 512), out=out, runner=Runner())
    out.write_text(killed(out).rstrip("\n"))
    runner = Runner()
    run_sweep(sweep(256, 512, 1024), out=out, resume=True, runner=runner)
    assert runner.calls == [1024]
    assert [r["seq_len"] for r in assert_whole_lines(out) if r["record"] == "point"] == [256, 512, 1024]


def test_a_report_holding_only_a_torn_line_is_repaired_before_a_new_sweep(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"record": "environment", "dattn_version": "0"}\n{"record": "point", "impl": "Impr')
    run_sweep(sweep(256), out=out, runner=Runner())
    records = assert_whole_lines(out)
    assert [r["record"] for r in records] == ["environment", "environment", "point", "run_end"]


# --- 2. two writers ------------------------------------------------------------------------------------------------


def test_a_second_writer_of_the_same_report_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "r.jsonl"
    second = {}

    def runner(sweep_, problem):
        if not second:  # while the first sweep holds the report, start another dattn on it
            second["done"] = dattn(
                "bench",
                "--impl",
                "ImprovedDilatedAttention",
                "--seq-len",
                "256",
                *TINY,
                "--out",
                str(out),
                "--resume",
                timeout=120,
            )
        return ok_result(problem.seq_len)

    run_sweep(sweep(256, 512), out=out, runner=runner)
    done = second["done"]
    assert done.returncode == 2, done.stderr
    error = one_line_error(done.stderr)
    assert f"--out {out} is being written by another dattn (pid {os.getpid()})" in error
    records = assert_whole_lines(out)
    assert [r["seq_len"] for r in records if r["record"] == "point"] == [256, 512]  # no duplicate point


def test_the_report_is_free_again_after_the_sweep(tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(BaseException):  # noqa: B017 - an interrupt (KeyboardInterrupt, or what the CLI turns it into)
        run_sweep(sweep(256, 512), out=out, runner=lambda s, p: (_ for _ in ()).throw(KeyboardInterrupt))
    runner = Runner()
    run_sweep(sweep(256, 512), out=out, resume=True, runner=runner)
    assert runner.calls == [256, 512]


# --- 3. an output over the report ----------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--csv", "--json", "--plot"])
@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_an_output_naming_the_out_report_is_refused_before_measuring(tmp_path, capsys, monkeypatch, option, spelling):
    out = tmp_path / "r.jsonl"
    run_sweep(sweep(256), out=out, runner=Runner())
    before = out.read_bytes()
    other = {"same": str(out), "dot": str(tmp_path / "." / "r.jsonl"), "link": str(tmp_path / "link.jsonl")}[spelling]
    if spelling == "link":
        os.symlink(out, other)
    runner = Runner()
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)
    code, _, err = run_cli(
        [
            "bench",
            "--impl",
            "ImprovedDilatedAttention",
            "--seq-len",
            "256,512",
            *TINY,
            "--out",
            str(out),
            "--resume",
            option,
            other,
        ],
        capsys,
    )
    assert code == 2 and runner.calls == []
    assert option in one_line_error(err) and "--out" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize("args", [["--calibrate", "{r}", "--save", "{r}"], ["--check", "{r}", "--json", "{r}"]])
def test_plan_output_naming_its_input_report_is_refused(tmp_path, capsys, args):
    report = tmp_path / "r.jsonl"
    report.write_text(Path("benchmarks/plan_check_cpu.jsonl").read_text())
    before = report.read_bytes()
    code, _, err = run_cli(["plan", *[a.format(r=report) for a in args]], capsys)
    assert code == 2 and "name the same file" in one_line_error(err)
    assert report.read_bytes() == before


# --- 4. an --out that cannot hold a report -------------------------------------------------------------------------


def _bench_out(out: str, **kwargs) -> subprocess.CompletedProcess:
    return dattn("bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "256", *TINY, "--out", out, **kwargs)


@pytest.fixture
def bench(capsys, monkeypatch):
    """`dattn bench --out OUT` in this process with a scripted runner: (exit code, stderr, runner)."""
    runner = Runner()
    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)

    def run(out: str, *lengths: int):
        code, _, err = run_cli(
            [
                "bench",
                "--impl",
                "ImprovedDilatedAttention",
                "--seq-len",
                ",".join(map(str, lengths or (256,))),
                *TINY,
                "--out",
                out,
            ],
            capsys,
        )
        return code, err, runner

    return run


def test_out_a_directory_is_refused(tmp_path, bench):
    code, err, runner = bench(str(tmp_path))
    assert code == 2 and "--out" in one_line_error(err) and "directory" in err and runner.calls == []


def test_out_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "r.jsonl"
    os.mkfifo(fifo)
    done = _bench_out(str(fifo), timeout=30)  # it used to block on open() for ever
    assert done.returncode == 2 and "--out" in one_line_error(done.stderr) and "FIFO" in done.stderr


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))


def test_out_dev_full_is_refused_without_reading_it():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    # --resume's reader used to read /dev/full for ever (bounded here by an address-space cap)
    done = _bench_out("/dev/full", timeout=60, preexec_fn=_cap_memory)
    assert done.returncode == 2 and "--out" in one_line_error(done.stderr) and "device" in done.stderr


def test_out_dev_null_is_refused(bench):
    code, err, runner = bench("/dev/null")
    assert code == 2 and "--out" in one_line_error(err) and "character device" in err and runner.calls == []


def test_out_under_a_regular_file_is_refused(tmp_path, bench):
    (tmp_path / "file").write_text("x")
    code, err, runner = bench(str(tmp_path / "file" / "r.jsonl"))
    assert code == 2 and "--out" in one_line_error(err) and "not a directory" in err and runner.calls == []


def test_out_in_a_directory_nobody_may_write_is_refused(bench):
    # /sys refuses new files even to root (permissions cannot be tested by chmod as root)
    code, err, runner = bench("/sys/dattn-report.jsonl")
    assert code == 2 and "--out" in one_line_error(err) and "writable" in err and runner.calls == []


@pytest.fixture
def small_mount(tmp_path):
    """mount(options): a tmpfs (root only) mounted at a fresh directory; skips where mounting is not allowed."""
    target = tmp_path / "mnt"
    target.mkdir()

    def mount(options: str) -> Path:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        return target

    yield mount
    subprocess.run(["umount", str(target)], capture_output=True)


def test_out_on_a_read_only_file_system_is_refused(small_mount, bench):
    mnt = small_mount("ro,size=16k")
    code, err, runner = bench(str(mnt / "r.jsonl"))
    assert code == 2 and "--out" in one_line_error(err) and "Read-only" in err and runner.calls == []


def test_a_disk_that_fills_up_mid_sweep_exits_1_with_the_rows_before_intact(small_mount, bench):
    out = small_mount("size=16k") / "r.jsonl"
    code, err, runner = bench(str(out), *range(256, 256 + 64 * 40, 64))  # far more rows than 16 KiB holds
    assert code == 1
    error = one_line_error(err)
    assert f"--out {out}" in error and "No space left on device" in error
    kept = [r for r in assert_whole_lines(out) if r["record"] == "point"]
    assert 0 < len(kept) == len(runner.calls) - 1 and f"{len(kept)} point(s) written before are intact" in error


def test_a_failed_write_cuts_the_report_back_to_its_last_whole_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)

    def runner(sweep_, problem):  # the third row may grow the file by 100 bytes only (EFBIG after a short write)
        if problem.seq_len == 1024:
            resource.setrlimit(resource.RLIMIT_FSIZE, (out.stat().st_size + 100, limit[1]))
        return ok_result(problem.seq_len)

    monkeypatch.setattr("dattn_cli.bench.sweep.run_isolated", runner)
    try:
        code, _, err = run_cli(
            ["bench", "--impl", "ImprovedDilatedAttention", "--seq-len", "256,512,1024,2048", *TINY, "--out", str(out)],
            capsys,
        )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert code == 1
    assert "File too large" in one_line_error(err) and "2 point(s) written before are intact" in err
    assert [r["seq_len"] for r in assert_whole_lines(out) if r["record"] == "point"] == [256, 512]
    assert [r.seq_len for r in read_rows(out)] == [256, 512]
