"""runtime.contention: other processes' CPU during a window, and the rule that flags a point as contended."""

import subprocess
import sys
import time

import pytest

from dattn_cli.runtime import contention
from dattn_cli.runtime.contention import CpuSample, contention_reason, cpu_sample, others_busy_cpus

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def test_this_process_spinning_is_not_other_load():
    before = cpu_sample()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        pass
    others = others_busy_cpus(before, cpu_sample())
    assert others is not None and others < 0.6  # generous: other tests may share the machine


def test_a_busy_neighbour_is_seen():
    neighbour = subprocess.Popen([sys.executable, "-c", SPIN.format(s=3.0)])
    try:
        time.sleep(0.3)  # let it start
        before = cpu_sample()
        time.sleep(0.6)
        others = others_busy_cpus(before, cpu_sample())
    finally:
        neighbour.kill()
        neighbour.wait()
    assert others is not None and others > 0.4


def test_other_ranks_cpu_time_is_not_other_load():
    before, after = CpuSample(0.0, 10.0, 1.0), CpuSample(1.0, 11.8, 1.9)
    assert others_busy_cpus(before, after) == pytest.approx(0.9)
    assert others_busy_cpus(before, after, own_extra_s=0.9) == pytest.approx(0.0)


def test_windows_too_short_for_jiffies_are_unknown():
    assert others_busy_cpus(CpuSample(0.0, 0.0, 0.0), CpuSample(0.01, 0.01, 0.0)) is None


def test_unreadable_proc_stat_is_unknown(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no /proc")
    monkeypatch.setattr("builtins.open", refuse)
    assert cpu_sample() is None


@pytest.mark.parametrize("others,threads,flagged", [(0.2, 2, False), (0.3, 2, True), (1.2, 1, False),
                                                    (1.3, 1, True), (None, 2, False)])
def test_the_rule_leaves_room_for_the_points_threads(others, threads, flagged):
    reason = contention_reason(others, threads, cpus=2)
    assert (reason is not None) == flagged
    if flagged:
        assert f"{others:.1f} of 2 CPUs" in reason and f"{threads} torch thread" in reason


def test_load_average_is_three_figures():
    assert contention.load_average() is None or len(contention.load_average()) == 3
