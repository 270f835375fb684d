"""runtime.contention: other processes' CPU during a window, and the rule that flags a point as contended.

The machine is shared (other tests, other users), so the tests on real samples assert what holds under any
background load: this process's own CPU is never counted as other load (busy CPUs of the affinity set, own
included, cannot exceed the set), and a process spinning beside it is seen."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dattn_cli.runtime import contention
from dattn_cli.runtime.contention import CpuSample, contention_reason, cpu_sample, others_busy_cpus

ROUNDING = 0.35  # CPUs: whole clock ticks over a window of about half a second, with margin
SPIN = (
    "import sys, time\nend = time.monotonic() + {s}\nprint('spinning', flush=True)\n"
    "while time.monotonic() < end:\n    pass\n"
)


def test_this_process_busy_on_every_cpu_is_not_other_load():
    cpus = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(cpus)
    a = torch.randn(512, 512)
    try:
        before = cpu_sample()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            a @ a
        after = cpu_sample()
    finally:
        torch.set_num_threads(threads)
    own_cpus = (after.own_s - before.own_s) / (after.wall_s - before.wall_s)
    others = others_busy_cpus(before, after)
    # counting our own threads as others (or summing the aggregate "cpu" line) breaks this under any load
    # lighter than every CPU's worth of other work
    assert others is not None and others + own_cpus <= cpus + ROUNDING, (others, own_cpus)


def test_a_busy_neighbour_is_seen():
    neighbour = subprocess.Popen([sys.executable, "-c", SPIN.format(s=5.0)], stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout.readline().strip() == "spinning"
        before = cpu_sample()
        time.sleep(0.6)
        others = others_busy_cpus(before, cpu_sample())
    finally:
        neighbour.kill()
        neighbour.wait(timeout=10)
    assert others is not None and others > 0.4


def test_other_ranks_cpu_time_is_not_other_load():
    before, after = CpuSample(0.0, 10.0, 1.0), CpuSample(1.0, 11.8, 1.9)
    assert others_busy_cpus(before, after) == pytest.approx(0.9)
    assert others_busy_cpus(before, after, own_extra_s=0.9) == pytest.approx(0.0)
    assert others_busy_cpus(before, after, own_extra_s=2.0) == 0.0  # never below zero


def test_windows_too_short_for_clock_ticks_are_unknown():
    start = CpuSample(0.0, 0.0, 0.0)
    assert others_busy_cpus(start, CpuSample(contention.MIN_WINDOW_S * 0.9, 0.05, 0.0)) is None
    assert others_busy_cpus(start, CpuSample(contention.MIN_WINDOW_S, 0.05, 0.0)) is not None


def test_unreadable_proc_stat_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(contention, "PROC_STAT", str(tmp_path / "missing"))
    assert cpu_sample() is None


@pytest.mark.parametrize("text", ["cpu0 a b c\n", "intr 1 2 3\n", ""], ids=["garbled", "no-cpu-lines", "empty"])
def test_proc_stat_without_usable_cpu_lines_is_unknown(monkeypatch, tmp_path, text):
    stat = tmp_path / "stat"
    stat.write_text(text)
    monkeypatch.setattr(contention, "PROC_STAT", str(stat))
    assert cpu_sample() is None


def test_busy_time_counts_only_this_process_cpus_and_their_busy_fields(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  999 999 999 999 999 999 999 999 0 0\n"
        "cpu0 100 10 20 5000 70 1 2 3 40 0\n"
        "cpu1 100 10 20 5000 70 1 2 3 40 0\n"
        "cpu7 900 0 0 0 0 0 0 0 0 0\n"
    )
    monkeypatch.setattr(contention, "PROC_STAT", str(stat))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    sample = cpu_sample()
    assert sample.busy_s == pytest.approx(2 * (100 + 10 + 20 + 1 + 2 + 3) / 100)  # idle, iowait, guest: not busy


@pytest.mark.parametrize(
    "others,threads,flagged",
    [
        (0.2, 2, False),
        (0.3, 2, True),  # 2 threads on 2 CPUs: any other work beyond the tolerance
        (1.2, 1, False),
        (1.3, 1, True),  # 1 thread: one CPU may be the others'
        (0.2, 4, False),
        (0.3, 4, True),  # 4 threads on 2 CPUs need both, no more
        (None, 2, False),
    ],
)
def test_the_rule_leaves_room_for_the_points_threads(others, threads, flagged):
    reason = contention_reason(others, threads, cpus=2)
    assert (reason is not None) == flagged
    if flagged:
        assert reason.startswith(
            f"other processes kept {others:.1f} of 2 CPUs busy while this point ran its {threads} torch thread"
        )


def test_the_reason_says_one_cpu_and_one_thread_in_the_singular():
    reason = contention_reason(0.5, 1, cpus=1)
    assert "kept 0.5 of 1 CPU busy" in reason and "its 1 torch thread," in reason and "not trustworthy" in reason
    assert contention_reason(0.5, 1, cpus=0) is None


def test_load_average_is_three_rounded_figures(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.23456, 0.5, 0.0))
    assert contention.load_average() == [1.23, 0.5, 0.0]
    monkeypatch.delattr(os, "getloadavg")
    assert contention.load_average() is None


@pytest.mark.parametrize(
    "cpus, torch_default, world, omp, expected",
    [
        (2, 2, 1, None, 1),  # a 2-vCPU runner: one CPU left free
        (1, 1, 1, None, 1),  # nothing to leave free
        (64, 32, 1, None, 32),  # torch's default (physical cores) already leaves CPUs free: kept
        (8, 8, 1, None, 7),
        (2, 2, 1, "2", 2),  # OMP_NUM_THREADS is the user's word
        (16, 16, 2, None, 7),  # ranks share the CPUs, one left free
        (2, 2, 2, None, 1),  # as many ranks as CPUs: one thread each, nothing to leave
    ],
)
def test_measurement_threads_leave_a_cpu_free(monkeypatch, cpus, torch_default, world, omp, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_default)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert contention.measurement_threads(None, world) == expected
    assert contention.measurement_threads(3, world) == 3
