"""The forkserver every worker and rank of runtime/launch.py is forked from: started once per dattn process with
torch and dattn's kernels preloaded (a child starts in milliseconds), dying with that process (orphans.py)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .attach import strip_launcher_variables
from .orphans import PARENT_ENV, die_with_parent

# torch.autograd.grad imports symbolic_shapes (and sympy) on its first call: 5 s in each of 4 ranks sharing 2 cores,
# once per process group, unless the forkserver has it already
PRELOAD = [
    "dattn_cli.runtime.forkserver_init",
    "torch",
    "torch.fx.experimental.symbolic_shapes",
    "dattn_cli.kernels",
    "dattn_cli.workload.build",
]


_CONTEXT: Any = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def start_forkserver() -> tuple[Any, int | None]:
    """The context with its forkserver running, and the forkserver's pid (the parent of every worker and rank)."""
    from multiprocessing import forkserver

    ctx = _context()
    # A death signal fires when the forking *thread* exits: only a forkserver started by the main thread
    # (which lives as long as this process) arms one.
    if threading.current_thread() is threading.main_thread():
        os.environ[PARENT_ENV] = str(os.getpid())
    else:
        os.environ.pop(PARENT_ENV, None)
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None:  # about to start it
        with _sigint_ignored_by_new_processes():
            server.ensure_running()
    else:
        server.ensure_running()
    return ctx, getattr(server, "_forkserver_pid", None)


@contextmanager
def _sigint_ignored_by_new_processes() -> Iterator[None]:
    """Ctrl-C reaches the whole process group, the forkserver and the resource tracker included: they start
    with SIGINT ignored (a disposition exec keeps, and Python leaves), so neither prints a KeyboardInterrupt
    traceback while it starts, and workers and ranks inherit it. Ctrl-C is this process's to handle. (A
    Ctrl-C inside these few milliseconds of fork and exec is lost.)"""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def child_main(parent: int | None, target: Callable[..., None], *args: Any) -> None:
    """Every worker and rank starts here: it dies with its parent, the forkserver."""
    die_with_parent(parent)
    strip_launcher_variables()  # spawned inside a torchrun job: its agent store is not this group's
    target(*args)
