"""Points measured in a launcher's world (runtime.attach): every rank measures each point in this process, in
lock-step with the others over the default process group, and every rank gets every rank's result, so all take
the same next step (the next N, the bisection of --until-oom) and agree on the exit code; only rank 0 writes.

Results travel through the process group's store, not a collective: a rank whose point failed (an exception,
an out-of-memory error) has left the collectives its peers are still in, and a collective after that would pair
the wrong operations. Each rank posts its result under the point's number and waits, up to --dist-timeout, for
everyone's; a rank that never posts is named as silent. After a failed point the process group cannot be
trusted (a peer may still be blocked in a collective), so the points after it are skipped with that reason.
"""

from __future__ import annotations

from ..runtime.attach import RankSilent, World, exchange, post_failure
from ..runtime.launch import peer_symptom
from ..workload.problem import Problem
from .config import Sweep
from .point import measure_point
from .worker import _combine_ranks, _set_threads, failure_row


class AttachedRunner:
    """The runner of a sweep in an attached world: `runner(sweep, problem) -> result` on every rank."""

    def __init__(self, world: World, timeout_s: float):
        self.world, self.timeout_s = world, timeout_s
        self.points = 0
        self.broken: str | None = None

    def __call__(self, sweep: Sweep, problem: Problem) -> dict:
        import torch.distributed as dist

        if self.broken:
            return {"status": "skipped", "reason": self.broken}
        if reason := problem.spec.shard_rule(problem, problem.world_size):
            return {"status": "skipped", "reason": f"cannot shard: {reason}"}
        self.points += 1
        _set_threads(sweep)
        device = f"cuda:{self.world.local_rank}" if sweep.cuda else sweep.device
        sweep, problem = (x.model_copy(update={"device": device}) for x in (sweep, problem))
        try:
            result = measure_point(sweep, problem, group=dist.group.WORLD)
        except BaseException as exc:  # every failure becomes this rank's row; its peers learn it from the store
            result = failure_row(exc)
            post_failure(self.world.rank, f"{problem.impl} N={problem.seq_len}: {result['error']}")
        results = self._exchange(result)
        bad = [(rank, r) for rank, r in enumerate(results) if r.get("status") != "ok"]
        if not bad:
            return _combine_ranks(results)
        failed = [(k, r) for k, r in bad if r.get("status") != "skipped"]
        if not failed:  # the ranks agree on skips (every clock decision is all-reduced)
            return bad[0][1]
        rank, first = next(((k, r) for k, r in failed if not peer_symptom(str(r.get("error", "")))), failed[0])
        self.broken = f"not measured: an earlier point failed on rank {rank} (attached world; see that row)"
        said = str(first.get("error") or first.get("reason"))
        return {
            **first,
            "reason": f"{first.get('reason', 'failed')} on rank {rank}",
            "error": (said if said.startswith(f"rank {rank} ") else f"rank {rank}: {said}")[:500],
        }

    def _exchange(self, result: dict) -> list[dict]:
        """Every rank's result for this point, in rank order; a rank silent past the deadline as an error."""
        results = exchange(f"bench/{self.points}", result, self.world, self.timeout_s)
        return [
            {"status": "error", "reason": "a rank failed", "error": r.message} if isinstance(r, RankSilent) else r
            for r in results
        ]
