"""Attach mode: join the world a launcher started (torchrun, srun, or an explicit MASTER_ADDR/RANK environment)
instead of spawning ranks here.

The launcher's environment says who this process is:

* torchrun (and torch.distributed.run / elastic agents): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
  TORCHELASTIC_RUN_ID;
* srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID inside a job step (SLURM_STEP_ID; a shell of an allocation
  is not a step, and is not attached), the master from --master-addr, MASTER_ADDR, or the first host of
  SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, the port from --master-port, MASTER_PORT, or 29500.

Every rank calls init_process_group with "cpu:gloo,cuda:nccl" (CPU tensors over gloo, CUDA tensors over NCCL;
gloo alone in a torch built without NCCL),
sets its CUDA device to LOCAL_RANK on a GPU run, runs the same points in lock-step, and only rank 0 prints and
writes. A rank that fails posts its error in the process group's store before it leaves (`post_failure`), so the
others, whose next collective then fails or times out, name it (`failed_ranks`).

Spawning ranks from inside such a job needs the launcher's variables gone (`LAUNCHER_VARIABLES`): an inherited
TORCHELASTIC_USE_AGENT_STORE makes the spawned group wait for an agent store that is not theirs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .heartbeat import failed_ranks, post_failure, prefix as attempt_prefix, restart_count  # noqa: F401 (post_failure: attach's API)

DEFAULT_PORT = 29500
BACKEND = "cpu:gloo,cuda:nccl"


def backend() -> str:
    """CPU tensors over gloo, CUDA tensors over NCCL; gloo alone where torch has no NCCL (CPU builds)."""
    import torch.distributed as dist

    return BACKEND if dist.is_nccl_available() else "gloo"


LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


@dataclass(frozen=True)
class World:
    """This process's place in a launcher's world."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | env


def _int(env: dict, name: str) -> int:
    value = env.get(name, "")
    if not value.strip().isdigit():
        raise ValueError(f"attach: {name}={value!r} is not a non-negative integer: fix the launcher's environment")
    return int(value)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[03-05,07],cpu1' -> 'gpu03' (zero padding kept)."""
    match = re.match(r"\s*([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        raise ValueError(f"attach: cannot read the node list {nodelist!r}: pass --master-addr")
    prefix, ranges = match.groups()
    return prefix + (re.split(r"[,-]", ranges)[0] if ranges else "")


def detect(env: dict | None = None, master_addr: str | None = None, master_port: int | None = None) -> World | None:
    """The launcher world this process was started in; None when it was not started by one."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if any(k.startswith(LAUNCHER_PREFIXES) for k in env) else "env"
        addr = master_addr or env.get("MASTER_ADDR")
        if not addr:
            raise ValueError(
                "attach: RANK and WORLD_SIZE are set but MASTER_ADDR is not: export MASTER_ADDR (and "
                "MASTER_PORT), or pass --master-addr"
            )
        port = master_port or (_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT)
        return _checked(
            World(
                _int(env, "RANK"),
                _int(env, "WORLD_SIZE"),
                _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                addr,
                port,
                launcher,
            )
        )
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = master_addr or env.get("MASTER_ADDR") or (first_host(nodes) if nodes else None)
        if not addr:
            raise ValueError("attach: srun gave no node list to find the master in: pass --master-addr")
        port = master_port or (_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT)
        return _checked(
            World(_int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID"), addr, port, "slurm")
        )
    return None


def _checked(world: World) -> World:
    if world.world_size < 1 or not 0 <= world.rank < world.world_size:
        raise ValueError(
            f"attach: rank {world.rank} of world size {world.world_size} is not a rank of that world: "
            "fix the launcher's RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS)"
        )
    if not 0 < world.master_port < 65536:
        raise ValueError(f"attach: master port {world.master_port} is not a TCP port: use 1-65535")
    return world


def local_ranks() -> int:
    """Ranks of this node in a launcher's world (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE's first figure), else 1."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").split("(")[0].split(",")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


_JOINED: list[World] = []  # the world this process's join initialised (not a library caller's), left by leave()


def leave() -> None:
    """Destroy the process group this process's join made, once every rank agreed to end (torch asks for it
    before exit; a gloo group left to the interpreter's teardown aborted a rank of the CI's srun step once:
    "terminate called without an active exception", exit 134)."""
    import torch.distributed as dist

    if _JOINED and dist.is_initialized():
        dist.destroy_process_group()
    _JOINED.clear()


def join(world: World, cuda: bool, timeout_s: float) -> None:
    """init_process_group for `world` (a no-op when this process already is in one, e.g. a library caller's)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != world.world_size or dist.get_rank() != world.rank:
            raise ValueError(
                f"attach: this process is already rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"not the launcher's rank {world.rank} of {world.world_size}"
            )
        return
    if cuda:
        if world.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"attach: LOCAL_RANK {world.local_rank} but this node has {torch.cuda.device_count()} "
                "visible GPU(s): launch one process per GPU (--nproc-per-node)"
            )
        torch.cuda.set_device(world.local_rank)
    address = f"tcp://{_host(world.master_addr)}:{world.master_port}"
    timeout = timedelta(seconds=timeout_s)
    try:
        if world.launcher == "torchrun":
            store = _attempt_store(world, timeout)
            dist.init_process_group(
                backend(), store=store, rank=world.rank, world_size=world.world_size, timeout=timeout
            )
        else:
            dist.init_process_group(
                backend(), init_method=address, rank=world.rank, world_size=world.world_size, timeout=timeout
            )
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"attach: rank {world.rank} of {world.world_size} could not join {address} ({world.launcher}): "
            f"{text}; check MASTER_ADDR/MASTER_PORT (--master-addr/--master-port) and that every rank "
            "started"
        ) from None
    _JOINED.append(world)


def _attempt_store(world: World, timeout: timedelta) -> Any:
    """The launcher's store (torchrun's agent store, or rank 0's) under this attempt's own prefix: torchrun keeps
    one store across the restarts of --max-restarts, and a restarted group reading the keys of the attempt before
    (gloo's addresses of ranks now dead) fails to connect."""
    import torch.distributed as dist
    from torch.distributed.rendezvous import _create_c10d_store

    store = _create_c10d_store(world.master_addr, world.master_port, world.rank, world.world_size, timeout)
    return dist.PrefixStore(f"dattn/attempt/{restart_count()}", store)


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def strip_launcher_variables() -> None:
    """Remove a launcher's variables from this process (a rank or worker spawned here)."""
    for key in list(os.environ):
        if key in LAUNCHER_VARIABLES or key.startswith(LAUNCHER_PREFIXES):
            del os.environ[key]


def exchange(tag: str, payload: Any, world: World, timeout_s: float) -> list[Any]:
    """Every rank's `payload` (any torch.save-able object) in rank order, through the default group's store: no
    collective, so a rank that left a collective halfway (its peer failed) still gets through. A rank that has
    not posted within timeout_s is a RankSilent naming it and what it posted with post_failure, if anything."""
    import io

    import torch
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    store.set(f"{attempt_prefix()}dattn/{tag}/{world.rank}", buffer.getvalue())
    keys = [f"{attempt_prefix()}dattn/{tag}/{rank}" for rank in range(world.world_size)]
    dead = _wait(store, keys, timeout_s)
    posted = failed_ranks(world.world_size)
    results: list[Any] = []
    for rank, key in enumerate(keys):
        if store.check([key]):
            results.append(torch.load(io.BytesIO(store.get(key)), weights_only=False))
        else:
            said = f"; it reported {posted[rank]}" if rank in posted else ""
            if rank in dead:
                results.append(RankSilent(f"rank {rank} {dead[rank]}{said}"))
            else:
                results.append(RankSilent(f"rank {rank} did not report within --dist-timeout {timeout_s:g} s{said}"))
    return results


def _wait(store: Any, keys: list[str], timeout_s: float) -> dict[int, str]:
    """Wait for `keys` up to timeout_s: a rank the heartbeat (runtime.heartbeat) finds dead
    ends the wait early. The ranks found dead or gone, with what happened to them."""
    import time

    from .heartbeat import current

    watch = current()
    deadline = time.monotonic() + timeout_s
    if watch is not None:
        watch.in_exchange = True
    try:
        while not store.check(keys):  # polled, not store.wait: a wait that times out is logged by c10d
            missing = {rank for rank, key in enumerate(keys) if not store.check([key])}
            if watch is not None and missing and missing <= set(watch.gone):
                return {rank: watch.gone[rank] for rank in missing}
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.02)
        return {}
    finally:
        if watch is not None:
            watch.in_exchange = False


@dataclass(frozen=True)
class RankSilent:
    """A rank that did not post its part of an exchange in time."""

    message: str
