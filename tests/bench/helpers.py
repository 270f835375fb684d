"""Worker entry points that misbehave on purpose (module-level, so a forkserver child can import them)."""

import os
import signal
import time

from dattn_cli.bench import worker


def raising_child(conn, sweep_data, problem_data):
    worker._child(conn, sweep_data, {**problem_data, "impl": "no-such-impl"})


def memory_error_child(conn, sweep_data, problem_data):
    def boom(*a, **k):
        raise MemoryError("simulated allocation failure")

    worker.measure_point = boom
    worker._child(conn, sweep_data, problem_data)


def killed_child(conn, sweep_data, problem_data):
    os.kill(os.getpid(), signal.SIGKILL)


def crashing_child(conn, sweep_data, problem_data):
    os._exit(3)


def sleeping_child(conn, sweep_data, problem_data):
    time.sleep(120)


def hog_child(conn, sweep_data, problem_data):
    """Touch memory past the cap without going through torch (the parent's RSS watchdog must act)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    blocks = []
    while True:
        blocks.append(bytearray(64 * 2**20))
        time.sleep(0.01)
