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
from ..workload.records import point_key, row_fields
from .config import Sweep
from .point import measure_point
from .worker import _combine_ranks, _set_threads, failure_row


class AttachedRunner:
    """The runner of a sweep in an attached world: `runner(sweep, problem) -> result` on every rank."""

    def __init__(self, world: World, timeout_s: float, done: dict | None = None):
        self.world, self.timeout_s = world, timeout_s
        self.points = 0
        self.broken: str | None = None
        self.done = done or {}  # rank 0's points already in the report (resume): rank 0 does not run them

    def __call__(self, sweep: Sweep, problem: Problem) -> dict:
        from ..runtime.heartbeat import measuring

        fields = row_fields(problem)
        if self.world.rank != 0 and (row := self.done.get(point_key(fields))) is not None:
            # rank 0 reads this point from its report: the same row here, so both take the same next step
            return {k: v for k, v in row.items() if k not in fields and k != "predicted_mem_bytes"}
        with measuring(f"{problem.impl} N={problem.seq_len:,}"):
            return self._point(sweep, problem)

    def _point(self, sweep: Sweep, problem: Problem) -> dict:
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


def resumed_points(world: World, report, timeout_s: float) -> dict:
    """The rows rank 0's report holds, by point key, on every rank (only rank 0 has the report): resuming,
    every rank takes the same rows as measured and the ranks stay in lock-step."""
    from ..workload.records import rows_with_settings

    rows = rows_with_settings(report) if report is not None and report.exists() else []
    first = exchange("resume", {row.key(): row.model_dump() for _, row in rows}, world, timeout_s)[0]
    return first if isinstance(first, dict) else {}
