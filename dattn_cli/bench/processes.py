"""A point measured in several fresh worker processes (--processes K), one after the other, its samples pooled.

Why: on the 2-vCPU test VM, about one worker process in 40 ran a point 1.3-1.7x slower than the others from
its first timed call to its last, with nothing else busy and a tight spread inside the process (sdpa at N=4096:
160 ms in most processes, 268 ms in one). Within one process nothing can tell that from a slower build; between
processes it is one outlier among K. Pooled, the samples of an outlier process are a third of the point's, and
`dattn compare`'s Hodges-Lehmann shift (the median of all pairwise differences) barely moves, while a change of
the code moves every process. pyperf runs 20 processes for the same reason; 3 keep the cost near one process's,
because --max-seconds is the point's budget and the processes share it.

`process_medians_ms` keeps each process's median, so a reader can see an outlier process.
The row's stopped_by and median_ci_pct are the pool's: processes that each reached --precision alone can pool
to a wider CI, and the row says so (stopped_by "processes", the pooled CI in noisy_reason).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from ..runtime.timings import median_ci_pct
from ..workload.problem import Problem
from .config import Sweep
from .point import noise, noise_reason, summary_fields
from .sampling import MIN_SAMPLES

OWN_REASONS = ("relative IQR", "stopped by")  # recomputed from the pooled samples, not carried over


def run_in_processes(sweep: Sweep, problem: Problem, launch: Callable[[Sweep, Problem], dict]) -> dict:
    """`launch` (one worker process a call) sweep.processes times, each with its share of --max-seconds; the
    first result that is not ok is the point's (a later process failing where the first fitted is still named)."""
    count = sweep.processes
    if count <= 1:
        return launch(sweep, problem)
    share = sweep.model_copy(update={"max_seconds": sweep.max_seconds / count})
    results = []
    for _ in range(count):
        result = launch(share, problem)
        if result.get("status") != "ok":
            return result
        results.append(result)
    return pooled(results, problem, sweep)


def pooled(results: list[dict], problem: Problem, sweep: Sweep) -> dict:
    """One row's fields from the ok results of several processes: samples in process order, the summary and
    the noisy flag recomputed from them, other processes' CPU and GPU state at their worst, memory at its
    largest; everything else from the first process."""
    times = [t / 1e3 for r in results for t in r["samples_ms"]]
    merged = {**results[0], **summary_fields(problem, times)}
    reasons = [r for r in [noise_reason(noise(sorted(times)))] if r]
    for result in results:
        for reason in (result.get("noisy_reason") or "").split("; "):
            if reason and not reason.startswith(OWN_REASONS) and reason not in reasons:
                reasons.append(reason)
    stopped_by, why = pooled_stop([r["stopped_by"] for r in results], times, sweep)
    if why:
        reasons.append(why)
    merged.update(
        process_medians_ms=[statistics.median(r["samples_ms"]) for r in results],
        processes=len(results),
        stopped_by=stopped_by,
        other_cpus=max((r["other_cpus"] for r in results if r.get("other_cpus") is not None), default=None),
        contended=any(r.get("contended") for r in results),
        throttled=any(r.get("throttled") for r in results),
        gpu_after=results[-1].get("gpu_after"),
        peak_mem_bytes=max(r.get("peak_mem_bytes") or 0 for r in results),
        warmup_calls=max(r.get("warmup_calls") or 0 for r in results),
        warmup_settled=all(r.get("warmup_settled", True) for r in results),
        noisy=bool(reasons),
        noisy_reason="; ".join(reasons) or None,
    )
    return merged


def pooled_stop(stops: list[str], times: list[float], sweep: Sweep) -> tuple[str, str | None]:
    """Why the pooled samples (`times`, seconds) stopped, judged on the pool, and the noisy reason when they fall
    short of --precision: each process stops on its own samples, and processes that each reached the precision
    alone can pool to a wider CI (their medians differ). "repeat" with --repeat; "precision" when the pooled
    median is known to --precision; else the first process's max-seconds or max-samples, or "processes" when
    every process had reached the precision alone."""
    if sweep.repeat is not None:
        return "repeat", None
    ci = median_ci_pct(times)
    if ci is not None and ci <= sweep.precision and len(times) >= MIN_SAMPLES:
        return "precision", None
    reached = f"+-{ci:.1f}%" if ci is not None else "no 95% CI"
    pool = f"the {len(times)} pooled samples give the median to {reached}, not --precision {sweep.precision:g}%"
    if short := next((s for s in stops if s in ("max-seconds", "max-samples")), None):
        return short, f"stopped by {short} in {stops.count(short)} of {len(stops)} processes, and {pool}"
    return "processes", f"stopped by processes: each of {len(stops)} reached --precision alone, and {pool}"
