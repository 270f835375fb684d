"""Faults inside a launcher's world (attach mode): a rank that dies, is stopped, or a job that is terminated.

Every rank beats in the launcher's store (the default group's store, its own connection with its own short
timeout, separate from --dist-timeout) from a daemon thread, `Watch`, which also reads its peers' beats. A rank
whose beat has not moved for DEAD_AFTER_S is dead (killed, or stopped: SIGSTOP, a frozen node).

Signals are seen by that thread too: the main thread may be blocked in a collective (gloo or NCCL) that no
Python handler can interrupt, so SIGINT/SIGTERM/SIGHUP are caught through the interpreter's wakeup fd, which
the C-level handler writes at once. The main thread's own handler parks it (a row being written is finished
first: sweep rows are written under signals.deferred). On a signal a rank posts that it was told to stop;
a peer that neither says so nor beats within GRACE_S is dead. So "the job was terminated" (every peer alive:
exit 128 + the signal, 143 for SIGTERM) is told from "a peer died" (exit 1).

The thread then leaves for the whole process: the lowest surviving rank prints one line naming the dead rank
and the point it was on (or the signal), and one line saying what was kept (`kept`, set by the command); the
process ends with os._exit, since a collective still waiting would hold a normal exit until its timeout.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from .signals import STOPPING, Interrupted

BEAT_S = 0.5
DEAD_AFTER_S = 10.0  # a beat that has not moved for this long: the rank is dead or stopped
FAILED_GRACE_S = 10.0  # a peer failed its point and this rank is still held in a collective this long: leave
GRACE_S = 5.0  # after a signal: how long peers have to say they were told to stop too
STORE_TIMEOUT_S = 5.0  # one store operation of the watch; the store gone for DEAD_AFTER_S is a fault too
KEY = "dattn/watch/"
FAILURE_KEY = "dattn/failed/"


def restart_count() -> int:
    """TORCHELASTIC_RESTART_COUNT: how many times torchrun restarted this group (0: the first attempt)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def prefix() -> str:
    """Store keys of this attempt: a group torchrun restarted may share its store with the attempt before."""
    return f"dattn/{restart_count()}/"


def post_failure(rank: int, message: str) -> None:
    """Leave this rank's error in the store of the default group, for the other ranks to name."""
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        if dist.is_initialized():
            _get_default_store().set(f"{prefix()}{FAILURE_KEY}{rank}", message[:500])
    except Exception:  # the store itself may be gone with the master: the deadline still names no one then
        pass


def failed_ranks(world_size: int, store: Any = None) -> dict[int, str]:
    """The errors ranks posted with post_failure, by rank (empty when none did or the store cannot say);
    `store`: a connection of the default group's store other than the main thread's (the heartbeat's)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = store or _get_default_store()
        found = {}
        for rank in range(world_size):
            key = f"{prefix()}{FAILURE_KEY}{rank}"
            if store.check([key]):
                found[rank] = store.get(key).decode(errors="replace")
        return found
    except Exception:
        return {}


class Watch:
    """The heartbeat and fault watch of one rank. `at`: what this rank is doing (the point), for the message
    naming a dead rank; `kept`: the sentence saying what was kept, for the last line."""

    current: Watch | None = None

    def __init__(self, world: Any, store: Any):
        self.world, self.store = world, store
        self.at = "starting"
        self.kept: Callable[[], str] = lambda: "nothing kept"
        self.report: Any = None
        self.peers = [r for r in range(world.world_size) if r != world.rank]
        self.seen: dict[int, tuple[bytes | None, float]] = {}
        self.stopped = threading.Event()
        self.in_exchange = False  # the main thread waits in the store (exchange), not in a collective
        self.gone: dict[int, str] = {}  # peers dead or left on a fault: what happened to them
        self.failed_since: float | None = None
        self.in_point = False  # the main thread is measuring a point (its collectives may hold it)
        self.failed_before: set[tuple[int, str]] = set()
        self.beats = 0
        self.previous: dict = {}
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        os.set_blocking(self.read_fd, False)
        self.thread = threading.Thread(target=self._run, name="dattn-watch", daemon=True)

    def point(self, at: str) -> None:
        """This rank starts `at` (a point, a check): said in the store at once, for the line naming a rank that
        dies in it (through the main thread's own connection: the watch's is the watch thread's)."""
        from torch.distributed.distributed_c10d import _get_default_store

        self.at, self.in_point = at, True
        try:
            _get_default_store().set(self.key("at", self.world.rank), at)
        except Exception:
            pass

    def key(self, what: str, rank: int) -> str:
        return f"{prefix()}{KEY}{what}/{rank}"

    def start(self) -> None:
        self.previous = {s: signal.getsignal(s) for s in STOPPING}
        for s in STOPPING:
            signal.signal(s, _park)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        Watch.current = self
        atexit.register(self._at_exit)
        self.thread.start()

    def _at_exit(self) -> None:
        """A rank ending otherwise (an error on this rank only, exit 2): its peers stop waiting for it."""
        if not self.stopped.is_set():
            self._set(self.key("left", self.world.rank), "ended before the others")

    def stop(self) -> None:
        """This rank is done (its exit code agreed): peers stop watching it, and it stops watching them.
        The signal handlers go back before the thread stops: a signal parked after that would have no one to end
        the process (the launcher's SIGTERM, sent as a peer leaves, then waited its 30 s for SIGKILL)."""
        self._set(self.key("left", self.world.rank), "done")
        if threading.current_thread() is threading.main_thread():
            for s, handler in self.previous.items():  # before the wakeup fd: a signal between is still seen
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            signal.set_wakeup_fd(self.previous_fd)
        self.stopped.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=4 * BEAT_S)  # out of its store call before the process group goes
        Watch.current = None

    def _set(self, key: str, value: str) -> bool:
        try:
            self.store.set(key, value)
            return True
        except Exception:
            return False

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # never leave a parked main thread without its watch
            self.leave(1, f"the fault watch of rank {self.world.rank} failed: {type(exc).__name__}: {exc}", [])

    def _watch(self) -> None:
        store_lost = None
        ready: list = []
        while not self.stopped.is_set():
            if ready and (signum := _signal_read(self.read_fd)) is not None:
                self._on_signal(signum)
            self.beats += 1
            beat = self._set(self.key("beat", self.world.rank), str(self.beats))
            ready, _, _ = select.select([self.read_fd], [], [], BEAT_S)
            if self.stopped.is_set():
                return
            if not beat:
                store_lost = store_lost or time.monotonic()
                if time.monotonic() - store_lost > DEAD_AFTER_S:
                    self.leave(1, "the launcher's store stopped answering (the launcher or rank 0 is gone)", [])
                continue
            store_lost = None
            self._check_peers()

    def _check_peers(self) -> None:
        """Leave for a dead peer, one that left on a fault, or one that failed its point while this rank is still
        held in a collective; in an exchange (the store) the main thread names them itself (`gone`)."""
        dead, left = self.dead(DEAD_AFTER_S), self._left_with_fault()
        self.gone = {**{r: "died (its heartbeat stopped)" for r in dead}, **{r: f"left ({why})" for r, why in left}}
        if self.in_exchange:
            self.failed_since = None
            return
        if dead:
            self.leave(1, None, dead)
        if left:
            self.leave(1, f"rank {left[0][0]} left ({left[0][1]}); this rank stops too", [])
        failed = self._failed() if self.in_point else []
        if not failed:
            self.failed_since = None
        elif self.failed_since is None:
            self.failed_since = time.monotonic()
        elif time.monotonic() - self.failed_since > FAILED_GRACE_S:
            rank, message = failed[0]
            self.leave(1, f"rank {rank} failed: {message}; this rank was held in a collective", [])

    def _failed(self) -> list[tuple[int, str]]:
        """Peers that posted a failure (post_failure) since this rank began its point."""
        posted = failed_ranks(self.world.world_size, self.store)
        return [(r, m) for r, m in posted.items() if r != self.world.rank and (r, m) not in self.failed_before]

    def _peer_state(self) -> dict[int, tuple[bytes | None, bool]]:
        """Each peer's beat and whether it has left (done, or a fault it saw)."""
        beats = self.store.multi_get([self.key("beat", r) for r in self.peers]) if self._have_all("beat") else None
        state = {}
        for i, rank in enumerate(self.peers):
            beat = beats[i] if beats is not None else self._get(self.key("beat", rank))
            state[rank] = (beat, self.store.check([self.key("left", rank)]))
        return state

    def _left_with_fault(self) -> list[tuple[int, str]]:
        """Peers that left because of a fault (not done, not told to stop): the group cannot finish."""
        found = []
        for rank in self.peers:
            value = self._get(self.key("left", rank))
            if value is not None and value != b"done" and not value.startswith(b"terminated"):
                found.append((rank, value.decode(errors="replace")))
        return found

    def _have_all(self, what: str) -> bool:
        return self.store.check([self.key(what, r) for r in self.peers])

    def _get(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    def dead(self, after_s: float, since: dict | None = None) -> list[int]:
        """The peers whose beat has not moved for `after_s` and that have not left."""
        now = time.monotonic()
        try:
            state = self._peer_state()
        except Exception:
            return []
        dead = []
        for rank, (beat, left) in state.items():
            last, when = self.seen.get(rank, (None, now))
            if beat != last or rank not in self.seen:
                self.seen[rank] = (beat, now)
                continue
            if not left and now - when > after_s:
                dead.append(rank)
        return dead

    def _on_signal(self, signum: int) -> None:
        """Told to stop: say so, and give the peers GRACE_S to say so too or to beat; one that does neither is
        dead (the launcher stops a job whose rank died)."""
        self._set(self.key("stop", self.world.rank), signal.Signals(signum).name)
        self._set(self.key("beat", self.world.rank), "stopping")
        start = {rank: beat for rank, (beat, _) in self._state_or_empty().items()}
        deadline = time.monotonic() + GRACE_S
        alive: set[int] = set()
        while time.monotonic() < deadline and len(alive) < len(self.peers):
            time.sleep(0.2)
            for rank, (beat, left) in self._state_or_empty().items():
                if left or beat != start.get(rank) or self.store.check([self.key("stop", rank)]):
                    alive.add(rank)
        dead = [r for r in self.peers if r not in alive]
        if not dead and (left := self._left_with_fault()):
            self.leave(1, f"rank {left[0][0]} left ({left[0][1]}); this rank stops too", [])
        self.leave(1 if dead else 128 + signum, None if dead else signal.Signals(signum).name, dead)

    def _state_or_empty(self) -> dict:
        try:
            return self._peer_state()
        except Exception:
            return {}

    def _at(self, rank: int) -> str:
        try:
            beat = self._get(self.key("at", rank))
        except Exception:
            beat = None
        return beat.decode(errors="replace") if beat else self.at

    def leave(self, code: int, reason: str | None, dead: list[int]) -> None:
        """End this process: the lowest surviving rank says why and what was kept."""
        said = f"terminated ({reason})" if code > 128 else f"exit {code}: {reason or 'a peer died'}"
        alive = [r for r in range(self.world.world_size) if r not in dead]
        if self.world.rank == min(alive):
            if dead:
                named = ", ".join(f"rank {r} (at {self._at(r)})" for r in dead)
                first = f"dattn: error: {named} died: its heartbeat stopped; the other ranks stop too"
                first = first.replace("its heartbeat", "their heartbeats") if len(dead) > 1 else first
            elif code > 128:
                first = f"dattn: interrupted: the job was terminated ({reason}) at {self.at}"
            else:
                first = f"dattn: error: {reason}"
            _say(first)
            _say(f"dattn: {self._kept()}")
        self._set(self.key("left", self.world.rank), said[:300])  # after the lines: a peer that sees it may print
        os._exit(code)

    def _kept(self) -> str:
        try:
            return self.kept()
        except Exception as exc:  # the line must come whatever the report holds
            return f"what was kept is unknown ({type(exc).__name__})"


def _signal_read(fd: int) -> int | None:
    try:
        data = os.read(fd, 64)
    except OSError:
        return None
    signals = [b for b in data if b in STOPPING]
    return signals[0] if signals else None


def _park(signum: int, _frame: object) -> None:
    """The main thread's handler while watched: it stops here, and the watch thread ends the process (a watch
    that is no longer running cannot: the signal is then the Interrupted of runtime.signals)."""
    while (watch := Watch.current) is not None and watch.thread.is_alive() and not watch.stopped.is_set():
        time.sleep(0.2)
    raise Interrupted(signum)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def watch(world: Any) -> Watch | None:
    """Start the watch of this rank of an attached world (None for a world of one, or when the store cannot be
    cloned)."""
    if world.world_size < 2 or threading.current_thread() is not threading.main_thread():
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    try:
        store = _get_default_store().clone()
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
    except Exception:
        return None
    w = Watch(world, store)
    w.start()
    return w


def current() -> Watch | None:
    return Watch.current


@contextmanager
def measuring(at: str) -> Iterator[None]:
    """This rank measures `at` (a point, a group of checks) inside: named if a rank dies in it, and a peer's
    failure posted meanwhile ends this rank after FAILED_GRACE_S if a collective still holds it."""
    watch = Watch.current
    if watch is not None:
        watch.point(at)
    try:
        yield
    finally:
        if watch is not None:
            watch.in_point = False
            # the failures posted so far are this point's or earlier ones: not a reason to leave a later point
            watch.failed_before = set(failed_ranks(watch.world.world_size).items())
