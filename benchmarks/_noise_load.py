"""Load that benchmarks/noise.py puts on the machine itself: busy processes, steady or coming and going.

Each busy process is a pure-Python spin loop (one CPU each, no torch, no memory to speak of) with two bounds
of its own, so none outlives the script even when the script is killed with SIGKILL: a deadline (seconds
from its start) and its parent (it ends when the process that started it is gone). The script stops them
by their process ids: SIGTERM, then SIGKILL after a grace period, each one waited for. They run in their
own session, so a Ctrl-C at the terminal reaches the script (which stops them) and not them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 2.0  # SIGTERM to SIGKILL
SPIN = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
parent = int(sys.argv[2])
x = 0
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20000):  # about a millisecond between the checks
        x += 1
"""


class Spinners:
    """`procs` busy processes, each ending by itself after `deadline_s` at the latest."""

    def __init__(self, procs: int, deadline_s: float):
        self.procs, self.deadline_s = procs, deadline_s
        self._running: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._running]

    def start(self) -> Spinners:
        try:
            for _ in range(self.procs):
                self._running.append(
                    subprocess.Popen(
                        [sys.executable, "-c", SPIN, str(self.deadline_s), str(os.getpid())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM to each by its pid, SIGKILL to any still running after GRACE_S; every one is reaped."""
        running, self._running = self._running, []
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        until = time.monotonic() + GRACE_S
        for proc in running:
            try:
                proc.wait(max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> Spinners:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Intermittent:
    """`procs` busy processes for `on_s` seconds, none for `off_s`, again and again from a small controller
    thread until stop(). The processes of one on-phase end by themselves shortly after it if the controller
    cannot stop them."""

    def __init__(self, procs: int, on_s: float, off_s: float):
        self.procs, self.on_s, self.off_s = procs, on_s, off_s
        self.cycles = 0
        self.pids_seen: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: Spinners | None = None
        self._thread: threading.Thread | None = None

    def _cycle(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._current = Spinners(self.procs, self.on_s + GRACE_S).start()
            self.pids_seen += self._current.pids
        self._stop.wait(self.on_s)
        with self._lock:
            if self._current is not None:
                self._current.stop()
                self._current = None
        self.cycles += 1
        self._stop.wait(self.off_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._cycle()

    def start(self) -> Intermittent:
        self._thread = threading.Thread(target=self._run, name="intermittent-load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.on_s + self.off_s + 2 * GRACE_S)
        with self._lock:
            if self._current is not None:
                self._current.stop()
                self._current = None

    def __enter__(self) -> Intermittent:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
