"""Signals that stop a run (Ctrl-C, SIGTERM, SIGHUP) become one exception, Interrupted, so that every
command unwinds the same way: workers and ranks are killed by the launcher's `finally`, rows already
written stay whole, and the CLI prints one line and exits 128 + the signal number (130, 143, 129).

Some libraries catch every exception while they probe optional imports, and so can swallow the one a
signal raises. A signal is therefore pending until the code that catches its Interrupted takes it
(take_pending): the launcher checks before it starts a worker (check_pending), and a signal still pending a
second later is delivered again.

`deferred()` marks a few statements that must finish once started (a report line and its count): a
signal arriving inside is handled when they are done.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REDELIVER_S = 1.0


class Interrupted(BaseException):
    """The run was stopped by signal `signum`. A BaseException, like KeyboardInterrupt, so that code recovering
    from a failed point or check (`except Exception`) lets it through. `detail`: what was kept and how to go on,
    for the message; `partial`: the results gathered before it, for whoever can still use them."""

    def __init__(self, signum: int = signal.SIGINT, detail: str = "", partial: Any = None):
        super().__init__(signum, detail)
        self.signum, self.detail, self.partial = int(signum), detail, partial

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def message(self) -> str:
        return "interrupted" + (f": {self.detail}" if self.detail else "")


class _Pending:
    """The signal received and not yet taken by the CLI, and the timer that delivers it again."""

    signum: int | None = None
    timer: threading.Timer | None = None

    @classmethod
    def set(cls, signum: int) -> None:
        cls.clear()
        cls.signum = signum
        cls.timer = threading.Timer(REDELIVER_S, cls.redeliver, (signum,))
        cls.timer.daemon = True
        cls.timer.start()

    @classmethod
    def redeliver(cls, signum: int) -> None:
        if cls.signum == signum:
            os.kill(os.getpid(), signum)

    @classmethod
    def stop_redelivery(cls) -> None:
        if cls.timer is not None:
            cls.timer.cancel()
            cls.timer = None

    @classmethod
    def clear(cls) -> int | None:
        signum, cls.signum = cls.signum, None
        cls.stop_redelivery()
        return signum


def _raise(signum: int, _frame: object) -> None:
    _Pending.set(signum)
    raise Interrupted(signum)


def take_pending() -> int | None:
    """The signal received under raising_interrupted and not taken yet (None if none); it is taken: code that
    has caught its Interrupted calls this before winding up (writing what it can), so it is not delivered again."""
    return _Pending.clear()


def check_pending() -> None:
    """Raise Interrupted again for a signal received and swallowed on its way (a point of no return, such as
    starting a worker, calls this)."""
    if _Pending.signum is not None:
        raise Interrupted(_Pending.signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def raising_interrupted() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread; the handlers before are restored
    after (the CLI's main runs inside it; a library caller's own handlers are left alone elsewhere)."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOPPING}
    previous_hook = sys.unraisablehook
    _Pending.clear()
    for s in STOPPING:
        signal.signal(s, _raise)
    sys.unraisablehook = _quiet_about_interrupted(previous_hook)
    try:
        yield
    finally:
        _Pending.clear()
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _quiet_about_interrupted(previous_hook):
    """A signal landing in a weakref callback or __del__ (importlib's module-lock callback, during a start-up
    import) raises where Python can only print 'Exception ignored ... Traceback'. The signal stays pending and
    is delivered again a moment later (REDELIVER_S), so that report is dropped; any other is passed on."""

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous_hook(unraisable)

    return hook


def ignore_stopping_signals() -> None:
    """From now on (until raising_interrupted restores its handlers) SIGINT, SIGTERM and SIGHUP are ignored: the
    run is already stopping."""
    if _in_main_thread():
        _Pending.clear()
        for s in STOPPING:
            signal.signal(s, signal.SIG_IGN)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving inside is delivered again on leaving, to the handler there was before: what is inside
    finishes first (e.g. a report line is written and counted, or not begun)."""
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.getsignal(s) for s in STOPPING}
    previous = {s: h for s, h in previous.items() if h is not None}  # None: installed outside Python, left alone
    for s in previous:
        signal.signal(s, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])
