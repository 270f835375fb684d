"""The CLI side of attach mode (runtime.attach): find and join the launcher's world, and agree on the exit code."""

from __future__ import annotations

from typing import Any

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
    from ..runtime.attach import RankSilent, exchange

    codes = exchange("exit", code, world, timeout_s)
    return max(1 if isinstance(c, RankSilent) else int(c) for c in codes)


def joined(o: Any, world_size: int | None, outputs: tuple[str, ...]) -> World | None:
    """The launcher's world for a command's options `o` (None: ranks are spawned here); on a rank other than 0,
    `o` made quiet and its `outputs` unset: only rank 0 prints and writes."""
    cuda = (o.device or "").startswith("cuda")
    world = attached_world(o.attach, o.master_addr, o.master_port, world_size, cuda, o.dist_timeout)
    if world is not None and world.rank != 0:
        o.quiet = True
        for name in outputs:
            setattr(o, name, None)
    return world
