"""The one launcher: runs work in processes it starts and watches, so a crash, an OOM or a hang becomes
a result, never a hang or a lost sweep.

* run_isolated: one worker process per measured point (target(conn, *args) sends one result); the
  parent kills it past its deadline or when its RSS grows past a limit.
* run_distributed: a function on p ranks of a torch.distributed process group on this machine.

Each rank is a process forked from a forkserver (torch preloaded), joins the group over TCP on a free
loopback port (so two runs never collide), runs `fn(rank, world_size, *args)` and sends back its
result or its error. The first rank that fails, or the deadline, ends every rank: the caller gets a
DistributedError naming the rank and the cause, never a hang. The same functions run under torchrun.

Results are typed where the caller names their type (`result=`, a pydantic model or a type of them): a worker's
or rank's result is validated on arrival, so a malformed one is a named failure here, not a KeyError later.

Every wait of the parent has a deadline: results are read through runtime.inbox, which never blocks on a
child stopped halfway through a send. No child outlives the parent (runtime.orphans: the forkserver dies
with the process that started it, workers and ranks with the forkserver), and an exception in the parent,
Interrupted by a signal included, kills the children of the call it interrupts.
"""

from __future__ import annotations

import io
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .forkserver import child_main as _child_main, start_forkserver as _forkserver
from .inbox import Inbox, wait_any
from .signals import check_pending, deferred

DEFAULT_TIMEOUT_S = 120.0
MAX_GRACE_S = 30.0  # past the group's own timeout, for the ranks to report theirs
BLAME_WAIT_S = 2.0  # after a first error, for the errors of the other ranks (to tell cause from consequence)


class DistributedError(RuntimeError):
    """A rank failed or the group timed out; the message names the rank and the cause."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_state(pid: int | None) -> str:
    """' (stopped ...)' when process `pid` is stopped (SIGSTOP, a debugger), else ''."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""
    return " (its process is stopped, e.g. by SIGSTOP)" if state in ("T", "t") else ""


def _pack(obj: Any) -> bytes:
    """Results travel as torch.save bytes: tensors arrive intact after their rank has exited."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def typed(result: Any, value: Any) -> Any:
    """`value` validated as `result` (a pydantic model or a type of them, e.g. list[Model]); None: as it is."""
    if result is None:
        return value
    from pydantic import TypeAdapter

    return TypeAdapter(result).validate_python(value)


def _name(result: Any) -> str:
    return getattr(result, "__name__", str(result))


def _rank_main(conn, rank: int, world_size: int, port: int, backend: str, timeout_s: float, fn, args) -> None:
    import torch
    import torch.distributed as dist

    from .contention import measurement_threads

    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        if backend == "gloo":  # CPU ranks share this machine's CPUs: 4 ranks of 2 threads on 2 cores ran 3.7x slower
            torch.set_num_threads(measurement_threads(None, world_size))
        result = fn(rank, world_size, *args)
        conn.send_bytes(_pack(("ok", result)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which ends the other ranks
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            conn.send_bytes(_pack(("error", message)))
        except (BrokenPipeError, OSError):
            pass
        conn.close()
        os._exit(1)  # never wait on peers that may be stuck in a collective
    conn.close()


PEER_SYMPTOMS = ("connection closed by peer", "connection reset", "remote worker", "broken pipe", "timed out")


def peer_symptom(message: str) -> bool:
    """Does this error only say that a peer went away (the cause is another rank's)?"""
    return any(p in message.lower() for p in PEER_SYMPTOMS)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


class _Group:
    """The ranks of one run_distributed call as the parent sees them: what each has reported."""

    def __init__(self, procs: list, inboxes: list[Inbox], timeout_s: float, result: Any = None):
        self.procs, self.inboxes, self.result = procs, inboxes, result
        self.started = time.monotonic()
        self.limit = timeout_s + min(MAX_GRACE_S, timeout_s)
        self.results: dict[int, Any] = {}
        self.errors: dict[int, str] = {}

    def silent(self) -> list[int]:
        return [r for r in range(len(self.procs)) if r not in self.results and r not in self.errors]

    def read(self) -> None:
        """Take what every rank that has not reported has sent; a rank gone without a result is an error."""
        for rank in self.silent():
            proc, inbox = self.procs[rank], self.inboxes[rank]
            alive = proc.is_alive()
            inbox.pump()  # after the liveness check: a rank that had exited has all its bytes in the pipe
            try:
                message = inbox.take_bytes()
            except EOFError:
                message, alive = None, False
            if message is not None:
                status, value = _unpack(message)
                if status == "ok":
                    try:
                        self.results[rank] = typed(self.result, value)
                    except ValueError as exc:  # pydantic's ValidationError
                        self.errors[rank] = f"its result is not a {_name(self.result)}: {str(exc).splitlines()[0]}"
                else:
                    self.errors[rank] = value
            elif not alive:
                proc.join(5)
                self.errors[rank] = f"exited with code {proc.exitcode} without a result"

    def wait(self, seconds: float) -> None:
        silent = self.silent()
        wait_any([self.inboxes[r] for r in silent], [self.procs[r].sentinel for r in silent], seconds)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def not_reported(self, within: float) -> str:
        silent = self.silent()
        states = "".join(process_state(self.procs[r].pid) for r in silent[:1])
        return f"{_ranks(silent)} did not report within {within:.0f} s{states}"

    def blame(self) -> str:
        """One failing rank takes its peers down with it: name the rank whose error is not a peer symptom, else
        a rank that never reported (stopped or stuck, its peers timed out waiting for it)."""
        until = min(time.monotonic() + BLAME_WAIT_S, self.started + self.limit)
        while self.silent() and time.monotonic() < until:
            self.wait(0.05)
            self.read()
        errors = self.errors
        causes = [r for r, m in errors.items() if not peer_symptom(m)]
        if not causes and self.silent():
            return f"{self.not_reported(self.elapsed())}; the ranks waiting for it failed: {errors[min(errors)]}"
        first = min(causes or errors)
        others = [r for r in sorted(errors) if r != first]
        suffix = f" (then ranks {others} failed as a consequence)" if others else ""
        return f"rank {first} failed: {errors[first]}{suffix}"


def _collect(group: _Group) -> list[Any]:
    world = len(group.procs)
    while len(group.results) < world:
        group.read()
        if group.errors:
            raise DistributedError(group.blame())
        if len(group.results) == world:
            break
        remaining = group.limit - group.elapsed()
        if remaining <= 0:
            raise DistributedError(group.not_reported(group.limit))
        group.wait(min(0.5, remaining))
    return [group.results[r] for r in range(world)]


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    result: Any = None,
) -> list[Any]:
    """fn(rank, world_size, *args) on each rank; returns the results in rank order, each validated as `result`
    when given. Every wait is bounded: a rank that has not reported within timeout_s plus a grace (at most 30 s)
    is named in a DistributedError."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    check_pending()
    ctx, server = _forkserver()
    port = free_port()
    procs: list = []
    inboxes: list[Inbox] = []
    finished = False
    try:
        for rank in range(world_size):
            receiver, sender = ctx.Pipe(duplex=False)
            inboxes.append(Inbox(receiver))
            proc = ctx.Process(
                target=_child_main,
                daemon=True,
                args=(server, _rank_main, sender, rank, world_size, port, backend, timeout_s, fn, args),
            )
            try:
                proc.start()
            finally:
                sender.close()
            procs.append(proc)
        results = _collect(_Group(procs, inboxes, timeout_s, result))
        finished = True
        return results
    finally:
        with deferred():  # a second Ctrl-C does not leave ranks behind
            _end(procs, inboxes, wait_s=5 if finished else 0)


def _end(procs: list, inboxes: list[Inbox], wait_s: float) -> None:
    for proc in procs:
        proc.join(timeout=wait_s)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    for inbox in inboxes:
        inbox.close()


def run_isolated(
    target: Callable[..., None],
    args: tuple,
    *,
    deadline_s: float,
    deadline_text: str = "its deadline",
    rss_limit: int | None = None,
    rss_limit_text: str = "",
    result: Any = None,
) -> Any:
    """target(conn, *args) in a fresh worker: what it sent, validated as `result` when given (one that does not
    validate is an error dict), or a failure dict (status oom / error / skipped)."""
    check_pending()
    ctx, server = _forkserver()
    receiver, sender = ctx.Pipe(duplex=False)
    inbox = Inbox(receiver)
    proc = ctx.Process(target=_child_main, args=(server, target, sender, *args), daemon=True)
    try:
        try:
            proc.start()
        finally:
            sender.close()
        outcome = _watch(proc, inbox, time.monotonic() + deadline_s, deadline_text, rss_limit, rss_limit_text)
        if isinstance(outcome, _Failure):
            return dict(outcome)
        try:
            return typed(result, outcome)
        except ValueError as exc:  # pydantic's ValidationError
            text = f"the worker's result is not a {_name(result)}: {str(exc).splitlines()[0]}"
            return {"status": "error", "reason": "malformed worker result", "error": text[:500]}
    finally:
        with deferred():
            if proc.pid is not None:
                _end([proc], [], wait_s=0)
            inbox.close()


class _Failure(dict):
    """The launcher's own outcome of a worker (oom, skipped, error), told apart from what a worker sent."""


def _watch(proc, inbox: Inbox, deadline: float, deadline_text: str, rss_limit: int | None, rss_limit_text: str) -> Any:
    from .measure import rss_bytes

    base_rss = None
    while True:
        alive = proc.is_alive()
        inbox.pump()
        try:
            message = inbox.take()
        except EOFError:
            message, alive = None, False
        if message is not None:
            return message
        if not alive:
            proc.join(5)
            return _Failure(worker_died(proc.exitcode))
        try:
            rss = rss_bytes(proc.pid)
        except (OSError, IndexError):
            rss = None
        if rss is not None:
            base_rss = rss if base_rss is None else min(base_rss, rss)
            if rss_limit is not None and rss - base_rss > rss_limit:
                proc.kill()
                return _Failure(
                    status="oom",
                    reason="out of memory",
                    error=f"worker RSS grew {(rss - base_rss) / 2**30:.2f} GiB, over {rss_limit_text}; killed",
                )
        if time.monotonic() > deadline:
            state = process_state(proc.pid)
            proc.kill()
            return _Failure(status="skipped", reason=f"time: point ran past {deadline_text}; killed{state}")
        wait_any([inbox], [proc.sentinel], 0.05)


def worker_died(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0 and -exitcode == 9:
        return {"status": "oom", "reason": "out of memory", "error": "worker killed by SIGKILL (likely the OOM killer)"}
    return {
        "status": "error",
        "reason": "worker crashed",
        "error": f"worker exited with code {exitcode} and sent no result",
    }
