"""Worker entry points that misbehave on purpose (module-level, so a forkserver child can import them)."""

import os
import signal
import time

from dattn_cli.bench import worker


def raising_child(conn, cfg_data, impl, n):
    worker._child(conn, {**cfg_data, "impls": ["no-such-impl"]}, "no-such-impl", n)


def memory_error_child(conn, cfg_data, impl, n):
    def boom(*a, **k):
        raise MemoryError("simulated allocation failure")

    worker.measure_point = boom
    worker._child(conn, cfg_data, impl, n)


def killed_child(conn, cfg_data, impl, n):
    os.kill(os.getpid(), signal.SIGKILL)


def crashing_child(conn, cfg_data, impl, n):
    os._exit(3)


def sleeping_child(conn, cfg_data, impl, n):
    time.sleep(120)


def hog_child(conn, cfg_data, impl, n):
    """Touch memory past the cap without going through torch (the parent's RSS watchdog must act)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    blocks = []
    while True:
        blocks.append(bytearray(64 * 2**20))
        time.sleep(0.01)
