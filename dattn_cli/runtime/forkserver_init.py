"""Imported by the forkserver as it starts (runtime.forkserver names it in its preload list), and
meant to be imported nowhere else: it arms the forkserver's death signal (orphans.die_with_parent), so the
forkserver, and through it every worker and rank, dies with the dattn process that started it.

It acts only in a process run as `python -c ...` whose parent is the pid the launcher put in PARENT_ENV:
the forkserver itself. It also ignores SIGINT there before the forkserver saves its handlers, so workers
and ranks start with Ctrl-C ignored: Ctrl-C reaches the whole foreground process group, and it is the
dattn process's to handle (it ends its workers); a worker must not turn it into a measured row. And it ends
quietly when dattn goes away in the middle of a request (an EOFError reading the request): dattn's one line
about the signal is the message, not the forkserver's traceback.
"""

import os
import signal
import sys

from .orphans import PARENT_ENV, die_with_parent

if sys.argv[:1] == ["-c"] and os.environ.get(PARENT_ENV) == str(os.getppid()):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(int(os.environ[PARENT_ENV]))
    _report = sys.excepthook
    sys.excepthook = lambda kind, value, tb: (
        None if issubclass(kind, (EOFError, ConnectionError)) else _report(kind, value, tb)
    )
