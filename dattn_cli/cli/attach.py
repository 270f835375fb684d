"""The CLI side of attach mode (runtime.attach): find and join the launcher's world, and agree on the exit code."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ..runtime.attach import World, detect, join


def attached_world(
    attach: bool | None,
    master_addr: str | None,
    master_port: int | None,
    world_size: int | None,
    cuda: bool,
    timeout_s: float,
) -> World | None:
    """The launcher's world, joined; None to spawn ranks here (no launcher, or --spawn). `world_size`: the
    --world-size given (None: not given), which must be the launcher's when attached."""
    if attach is False:
        return None
    world = detect(master_addr=master_addr, master_port=master_port)
    if world is None:
        if attach:
            raise ValueError(
                "--attach: no launcher environment found (RANK, WORLD_SIZE and MASTER_ADDR from torchrun, "
                "or SLURM_PROCID and SLURM_NTASKS in an srun step): start dattn with torchrun or srun, or "
                "drop --attach"
            )
        return None
    if world_size not in (None, 1, world.world_size):
        raise ValueError(
            f"--world-size {world_size}: this process is rank {world.rank} of a world of "
            f"{world.world_size} started by {world.launcher}; drop --world-size (or pass "
            f"{world.world_size}), or pass --spawn to spawn {world_size} ranks here instead"
        )
    join(world, cuda, timeout_s)
    return world


def agreed_exit_code(world: World | None, code: int, timeout_s: float = 60.0) -> int:
    """The largest exit code over the ranks (rank 0 decides what only it computed, e.g. the regression gate),
    through the store: a rank that died earlier makes it 1 here instead of a collective that never completes."""
    if world is None or world.world_size == 1:
        return code
    from ..runtime.attach import RankSilent, exchange, leave
    from ..runtime.heartbeat import current

    codes = exchange("exit", code, world, timeout_s)
    if (watch := current()) is not None:
        watch.stop()
    leave()
    return max(1 if isinstance(c, RankSilent) else int(c) for c in codes)


def refuse_launcher(command: str, attach: bool | None) -> None:
    """A command that runs in one process, started by a launcher with more than one rank: one line (rank 0's;
    the other ranks exit 2 quietly), not N copies of the same run."""
    if attach is False:
        return
    world = detect()
    if world is None or world.world_size == 1:
        return
    if world.rank != 0:  # silent: rank 0 says it; the launcher's SIGTERM after rank 0's exit ends this one quietly
        import signal
        import time

        from ..runtime.signals import STOPPING

        for s in STOPPING:
            signal.signal(s, signal.SIG_DFL)
        time.sleep(60)  # long enough for rank 0 to start and say it on a loaded machine (10 s was not)
        raise typer.Exit(code=2)
    raise ValueError(
        f"{command}: runs in one process and does not join a launcher's world ({world.launcher} started "
        f"{world.world_size} ranks): run `dattn {command}` without {world.launcher}, or with one process"
    )


def attached_resume(o: Any, world: World | None) -> bool:
    """Whether an attached bench continues its report: --resume, or a group torchrun restarted (--max-restarts,
    TORCHELASTIC_RESTART_COUNT > 0), said in one line. Only rank 0 has the report: --resume is unset on the
    others (bench.attached.resumed_points gives them rank 0's points)."""
    from ..runtime.heartbeat import restart_count

    if world is None:
        return bool(o.resume)
    resume = bool(o.resume)
    if not resume and (count := restart_count()):
        resume = True
        if world.rank == 0 and o.out is not None and o.out.exists():
            print(f"dattn: note: restart {count} of this torchrun group: resuming {o.out}", file=sys.stderr)
    o.resume = resume and world.rank == 0
    return resume


def joined(o: Any, world_size: int | None, outputs: tuple[str, ...]) -> World | None:
    """The launcher's world for a command's options `o` (None: ranks are spawned here); on a rank other than 0,
    `o` made quiet and its `outputs` unset: only rank 0 prints and writes."""
    cuda = (o.device or "").startswith("cuda")
    world = attached_world(o.attach, o.master_addr, o.master_port, world_size, cuda, o.dist_timeout)
    if world is not None:
        from ..runtime.heartbeat import watch

        if (w := watch(world)) is not None:
            w.report = getattr(o, "out", None)  # rank 0's report, named by whichever rank says what was kept
    if world is not None and world.rank != 0:
        o.quiet = True
        for name in outputs:
            setattr(o, name, None)
    return world
