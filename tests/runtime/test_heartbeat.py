"""runtime/heartbeat.py in one process: a rank's watch over an in-memory store (the launcher jobs that exercise it
whole are tests/faults/test_launcher_jobs.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dattn_cli.runtime import heartbeat
from dattn_cli.runtime.signals import Interrupted

ROOT = Path(__file__).resolve().parents[2]

# Rank 0 of two stops its watch, and the launcher's SIGTERM (sent because the peer left) lands while the watch
# thread winds down: the join below is where it came in CI (rank 1 then hung until torchrun's SIGKILL, 30 s on).
STOPPING_WHILE_SIGNALLED = """
import os, signal, time, types
import torch.distributed as dist
from dattn_cli.runtime import heartbeat

watch = heartbeat.Watch(types.SimpleNamespace(world_size=2, rank=0), dist.HashStore())
watch.start()
time.sleep(0.3)
join = watch.thread.join

def signalled_join(timeout=None):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
    join(timeout)

watch.thread.join = signalled_join
watch.stop()
print("stopped", flush=True)
"""


def test_a_signal_while_the_watch_stops_ends_the_process_not_parks_it():
    """Old order (thread stopped, then handlers restored): the signal parked the main thread with no watch left
    to end the process, a hang. Now the handler before the watch's (here the default) takes it at once."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", STOPPING_WHILE_SIGNALLED], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "stopped" not in done.stdout


def test_park_without_a_running_watch_raises_interrupted():
    """The parking handler with no watch to end the process: the signal becomes Interrupted, never a wait."""
    assert heartbeat.Watch.current is None
    with pytest.raises(Interrupted) as caught:
        heartbeat._park(signal.SIGTERM, None)
    assert caught.value.exit_code == 143
