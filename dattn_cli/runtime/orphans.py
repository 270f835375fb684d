"""No process outlives dattn: every process the launcher starts dies with its parent.

Linux's PR_SET_PDEATHSIG has the kernel send a signal to a process when its parent (precisely: the parent
*thread* that forked it) exits, however it exits, SIGKILL included. It is chained: the forkserver dies
with the dattn process that started it (forkserver_init.py sets it there), and workers and ranks, whose
parent is the forkserver, die with the forkserver. Without the chain a killed dattn leaves the forkserver
running as long as a worker holds its "alive" pipe, and the worker runs its point to the end.

Elsewhere (no prctl) nothing is set: the forkserver still exits when dattn's end of its pipe closes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
# Set by the launcher, in the process that starts the forkserver, to that process's pid; the forkserver
# arms its death signal only when its parent is that process (see forkserver_init.py).
PARENT_ENV = "DATTN_FORKSERVER_PARENT"


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent exits; if `parent` (the pid the caller
    expects as parent) is gone already, exit now. False where the platform has no PR_SET_PDEATHSIG."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if parent is not None and os.getppid() != parent:  # orphaned between fork and prctl
        os._exit(1)
    return armed
