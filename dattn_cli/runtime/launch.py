"""The one launcher: runs work in processes it starts and watches, so a crash, an OOM or a hang becomes
a result, never a hang or a lost sweep.

* run_isolated: one worker process per measured point (target(conn, *args) sends one result dict); the
  parent kills it past its deadline or when its RSS grows past a limit.
* run_distributed: a function on p ranks of a torch.distributed process group on this machine.


Each rank is a process forked from a forkserver (torch preloaded), joins the group over TCP on a free
loopback port (so two runs never collide), runs `fn(rank, world_size, *args)` and sends back its
result or its error. The first rank that fails, or the deadline, ends every rank: the caller gets a
DistributedError naming the rank and the cause, never a hang. The same functions run under torchrun.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import time
from datetime import timedelta
from typing import Any, Callable

DEFAULT_TIMEOUT_S = 120.0
_CONTEXT: Any = None


class DistributedError(RuntimeError):
    """A rank failed or the group timed out; the message names the rank and the cause."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "dattn_cli.kernels", "dattn_cli.workload.build"])
    return _CONTEXT


def _pack(obj: Any) -> bytes:
    """Results travel as torch.save bytes: tensors arrive intact after their rank has exited."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _rank_main(conn, rank: int, world_size: int, port: int, backend: str, timeout_s: float, fn, args) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
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


def _blame(errors: dict[int, str], pipes, results, wait_s: float = 2.0) -> str:
    """One failing rank takes its peers down with it; name the rank whose error is not a peer symptom."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for rank, pipe in enumerate(pipes):
            if rank in errors or rank in results:
                continue
            try:
                if pipe.poll(0.01):
                    status, value = _unpack(pipe.recv_bytes())
                    if status == "error":
                        errors[rank] = value
            except (EOFError, OSError):
                continue
    causes = [r for r, m in errors.items() if not any(p in m.lower() for p in PEER_SYMPTOMS)] or sorted(errors)
    first = min(causes)
    others = [r for r in sorted(errors) if r != first]
    suffix = f" (then ranks {others} failed as a consequence)" if others else ""
    return f"rank {first} failed: {errors[first]}{suffix}"


def run_distributed(
    fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Any]:
    """fn(rank, world_size, *args) on each rank; returns the results in rank order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = _context()
    port = free_port()
    pipes, procs = [], []
    for rank in range(world_size):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank_main, args=(sender, rank, world_size, port, backend, timeout_s, fn, args),
                           daemon=True)
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s + 30.0
    try:
        while len(results) < world_size:
            for rank, (pipe, proc) in enumerate(zip(pipes, procs)):
                if rank in results:
                    continue
                if pipe.poll(0.02):
                    try:
                        status, value = _unpack(pipe.recv_bytes())
                    except EOFError:
                        proc.join(5)
                        raise DistributedError(f"rank {rank} exited with code {proc.exitcode} without a result") from None
                    if status == "error":
                        raise DistributedError(_blame({rank: value}, pipes, results))
                    results[rank] = value
                elif not proc.is_alive():
                    raise DistributedError(f"rank {rank} exited with code {proc.exitcode} without a result")
            if time.monotonic() > deadline:
                waiting = [r for r in range(world_size) if r not in results]
                raise DistributedError(f"timed out after {timeout_s:g} s; ranks {waiting} did not finish")
    finally:
        for proc in procs:
            proc.join(timeout=5 if len(results) == world_size else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in pipes:
            pipe.close()
    return [results[r] for r in range(world_size)]


def run_isolated(target: Callable[..., None], args: tuple, *, deadline_s: float, deadline_text: str = "its deadline",
                 rss_limit: int | None = None, rss_limit_text: str = "") -> dict:
    """target(conn, *args) in a fresh worker; its dict, or a failure dict (status oom / error / skipped)."""
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(sender, *args), daemon=True)
    proc.start()
    sender.close()
    try:
        return _watch(proc, receiver, time.monotonic() + deadline_s, deadline_text, rss_limit, rss_limit_text)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        receiver.close()


def _watch(proc, receiver, deadline: float, deadline_text: str, rss_limit: int | None, rss_limit_text: str) -> dict:
    from .measure import rss_bytes

    base_rss = None
    while True:
        if receiver.poll(0.05):
            try:
                return receiver.recv()
            except EOFError:
                proc.join(5)
                return worker_died(proc.exitcode)
        if not proc.is_alive():
            proc.join()
            return worker_died(proc.exitcode)
        try:
            rss = rss_bytes(proc.pid)
        except (OSError, IndexError):
            continue
        base_rss = rss if base_rss is None else min(base_rss, rss)
        if rss_limit is not None and rss - base_rss > rss_limit:
            proc.kill()
            return {"status": "oom", "reason": "out of memory",
                    "error": f"worker RSS grew {(rss - base_rss) / 2**30:.2f} GiB, over {rss_limit_text}; killed"}
        if time.monotonic() > deadline:
            proc.kill()
            return {"status": "skipped", "reason": f"time: point ran past {deadline_text}; killed"}


def worker_died(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0 and -exitcode == 9:
        return {"status": "oom", "reason": "out of memory", "error": "worker killed by SIGKILL (likely the OOM killer)"}
    return {"status": "error", "reason": "worker crashed", "error": f"worker exited with code {exitcode} and sent no result"}
