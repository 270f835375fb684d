"""The comparison of matched points: one ComparePoint per pair, and the CompareReport with its verdict and
exit code.

Per point, with samples on both sides (samples_ms): ratio = median(NEW) / median(BASE); ci_low/ci_high =
the 95% CI of the ratio (Hodges-Lehmann/Moses on log samples, stats.py); p_value = two-sided Mann-Whitney
U; verdict by stats.verdict with the p-values Holm-adjusted over all the points compared, so that the
run as a whole keeps alpha. Then made inconclusive when the bench flagged a side contended or throttled (its
reason in the note: other processes' CPU, GPU throttling; match._noisy), when other processes' CPU during the
point (`other_cpus`) differs by more than half a CPU between the sides (benchmarks/noise.py: load on one side
moves the whole side, and the test alone called 9 of 10 such A/A pairs slower; with one torch thread on 2 CPUs a
1-CPU neighbour is not contention by the bench's rule, so the flag alone would not catch it), or when the side that
looks slower (faster) is far noisier than
the other (stats.spread_differs: the mark of load on one side, not of a code change) unless the CI lies wholly
beyond HUGE (2x) either way: load on one side moved no CI bound of benchmarks/noise.py's A/A pairs past 1.46x.

Without samples on a side (reports written before samples_ms) only the medians and p10/p90 of the
repeats are known, which no test can use. The rule: slower when the ratio of medians is at least
max(2, 1 + t) AND NEW's p10 is above BASE's p90 times (1 + t) (the spreads are apart beyond the threshold),
each side with at least 3 repeats; faster symmetrically (ratio at most 1/max(2, 1 + t), NEW's p90 below
BASE's p10 / (1 + t)); inconclusive otherwise, never same. ci and p are then None.

A point measured in one run but failed in the other (oom, error, skipped) is inconclusive, its status in
the note; a point failed in both is left out.

The report's verdict: slower when any point is slower; else inconclusive when any point is inconclusive,
except points whose CI lies wholly below 1 + t (`no_regression`: same or faster, not which, and a regression
beyond the threshold excluded; unflagged only: load on BASE could hide one); else faster when any point is
faster; else same. When the environments differ (match.py) the verdict is
inconclusive whatever the points say (a slowdown cannot be told from the other machine or load), the
differences in `warnings`. Exit codes: 0 same or faster; 1 slower (a regression beyond the threshold,
statistically established); 3 inconclusive. Bad input raises ValueError before any of this (exit 2).
"""

from __future__ import annotations

from pydantic import BaseModel, create_model

from ..workload.records import BenchRow
from .match import Side
from .stats import Verdict, band, holm, mann_whitney_p, ratio_ci, spread_differs, summarize, verdict

MIN_REPEATS = 3  # summary rule: p10/p90 of fewer repeats are the extremes of one or two calls
HUGE = 2.0  # summary rule: the smallest ratio that counts without samples
OTHER_CPUS_DIFFER = 0.5  # CPUs: a load difference during the point that no test on the samples can tell from a change
EXIT_CODES = {"same": 0, "faster": 0, "slower": 1, "inconclusive": 3}


# a point's configuration: these fields of its rows (NEW's, or --a's), as BenchRow has them
CONFIG_FIELDS = (
    "seq_len mode batch heads kv_heads head_dim segments dilations semantics causal dtype device world_size pattern "
    "target embed_dim layers checkpointing amp compiled documents vocab_size"
).split()


class _Figures(BaseModel):
    base_ms: float | None = None  # medians
    new_ms: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None  # as measured; the verdict used it Holm-adjusted over the points
    verdict: Verdict
    n_base: int = 0  # samples (repeats for a side without samples)
    n_new: int = 0
    noise_base: float | None = None  # relative IQR of the samples
    noise_new: float | None = None
    note: str | None = None
    no_regression: bool = False  # inconclusive only between same and faster: its whole CI is below 1 + t


ComparePoint = create_model(
    "ComparePoint",
    __doc__="""One matched configuration: BASE (or --b) against NEW (or --a); ratio = NEW / BASE. Notes say BASE
    and NEW for --b and --a too.""",
    impl=(str, ...),  # NEW's (or --a's) implementation
    impl_base=(str, ...),  # BASE's (or --b's): the same as impl when two reports are compared
    **{name: (BenchRow.model_fields[name].annotation, BenchRow.model_fields[name]) for name in CONFIG_FIELDS},
    **{name: (f.annotation, f) for name, f in _Figures.model_fields.items()},
)


class CompareReport(BaseModel):
    points: list[ComparePoint]
    verdict: Verdict
    warnings: list[str]
    comparable: bool = True  # False: the environments differ (named in warnings)
    threshold_pct: float
    alpha: float

    def exit_code(self) -> int:
        """0 no regression; 1 a regression beyond the threshold, statistically established; 3 inconclusive."""
        return EXIT_CODES[self.verdict]


def _config(base: BenchRow, new: BenchRow) -> dict:
    fields = new.model_dump(include=set(ComparePoint.model_fields) - {"verdict", "note"})
    return {**fields, "impl_base": base.impl, "pattern": new.pattern or base.pattern}


def _ok(side: Side) -> bool:
    return side.row.status == "ok" and side.row.time_ms is not None


def _sampled(base: Side, new: Side) -> dict:
    """The statistics of a pair with samples on both sides (verdict decided later, with adjusted p)."""
    b, n = summarize(base.samples), summarize(new.samples)
    ci = ratio_ci(base.samples, new.samples)
    return dict(
        base_ms=b.median,
        new_ms=n.median,
        ratio=n.median / b.median,
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
        p_value=mann_whitney_p(base.samples, new.samples),
        n_base=b.n,
        n_new=n.n,
        noise_base=b.noise,
        noise_new=n.noise,
        note=None if ci else f"too few samples for a 95% CI ({b.n} and {n.n})",
    )


def _summary_only(base: BenchRow, new: BenchRow, threshold_pct: float) -> dict:
    """A pair without samples on a side: the rule in the module docstring."""
    lower, upper = band(threshold_pct)
    huge = max(HUGE, upper)
    ratio = new.time_ms / base.time_ms
    result: Verdict = "inconclusive"
    spreads = None not in (base.time_ms_p10, base.time_ms_p90, new.time_ms_p10, new.time_ms_p90)
    if spreads and min(base.repeats, new.repeats) >= MIN_REPEATS:
        if ratio >= huge and new.time_ms_p10 > base.time_ms_p90 * upper:
            result = "slower"
        elif ratio <= 1 / huge and new.time_ms_p90 < base.time_ms_p10 * lower:
            result = "faster"
    return dict(
        base_ms=base.time_ms,
        new_ms=new.time_ms,
        ratio=ratio,
        n_base=base.repeats,
        n_new=new.repeats,
        verdict=result,
        note=f"no samples_ms (older report): medians and p10/p90 only; a change counts "
        f"only when at least {huge:g}x with the spreads apart",
    )


def _failed(base: Side, new: Side) -> dict:
    statuses = [
        f"{name} {s.row.status}" + (f" ({s.row.reason or s.row.error})" if s.row.reason or s.row.error else "")
        for name, s in (("BASE", base), ("NEW", new))
        if not _ok(s)
    ]
    return dict(verdict="inconclusive", note="; ".join(statuses) + ": not compared")


def _decide(point: dict, base: Side, new: Side, p_adjusted: float | None, threshold_pct: float, alpha: float) -> dict:
    """The verdict of a sampled pair, and the reasons that make it inconclusive."""
    result = verdict(point["ci_low"], point["ci_high"], p_adjusted, threshold_pct, alpha)
    if (
        result in ("slower", "faster")
        and not _beyond_load(point, threshold_pct)
        and (spread := spread_differs(base.samples, new.samples))
    ):
        return {**point, "verdict": "inconclusive", "note": _joined(point["note"], spread)}
    if result == "inconclusive" and point["ci_high"] is not None and point["ci_high"] <= band(threshold_pct)[1]:
        note = f"a regression beyond the threshold is excluded (CI up to {point['ci_high']:.3f})"
        return {**point, "verdict": result, "no_regression": True, "note": _joined(point["note"], note)}
    return {**point, "verdict": result}


def _beyond_load(point: dict, threshold_pct: float) -> bool:
    """The CI lies wholly beyond max(HUGE, 1 + t) (or below its inverse): a change that one-sided load does not
    make. benchmarks/noise.py's loaded and process A/A pairs never put a CI bound past 1.46x."""
    huge = max(HUGE, band(threshold_pct)[1])
    return point["ci_low"] >= huge or point["ci_high"] <= 1 / huge


def _flagged(point: dict, base: Side, new: Side) -> dict:
    """A point a side of which the bench flagged (contention, throttling), or whose sides saw clearly different
    CPU use by other processes, is inconclusive."""
    flags = [f"{name} flagged noisy: {s.flag}" for name, s in (("BASE", base), ("NEW", new)) if s.flag]
    others = (base.row.other_cpus, new.row.other_cpus)
    if None not in others and abs(others[0] - others[1]) > OTHER_CPUS_DIFFER:
        flags.append(
            f"other processes kept {others[0]:.1f} CPUs busy during BASE's point, {others[1]:.1f} during "
            "NEW's: load on one side shifts every call"
        )
    if not flags:
        return point
    return {**point, "verdict": "inconclusive", "no_regression": False, "note": _joined(point.get("note"), *flags)}


def _joined(*notes: str | None) -> str:
    return "; ".join(filter(None, notes))


def compare_pairs(pairs: list[tuple[Side, Side]], threshold_pct: float, alpha: float = 0.05) -> list[ComparePoint]:
    """One ComparePoint per (BASE, NEW) pair, in the order given; pairs failed on both sides are left out."""
    band(threshold_pct)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    kept = [(b, n) for b, n in pairs if _ok(b) or _ok(n)]
    figures: list[dict] = []
    for base, new in kept:
        if not (_ok(base) and _ok(new)):
            figures.append(_failed(base, new))
        elif base.samples and new.samples:
            figures.append(_sampled(base, new))
        else:
            figures.append(_summary_only(base.row, new.row, threshold_pct))
    adjusted = holm([f.get("p_value") if "verdict" not in f else None for f in figures])
    points = []
    for (base, new), figure, p in zip(kept, figures, adjusted):
        if "verdict" not in figure:
            figure = _decide(figure, base, new, p, threshold_pct, alpha)
        if _ok(base) and _ok(new):
            figure = _flagged(figure, base, new)
        points.append(ComparePoint(**_config(base.row, new.row), **figure))
    return points


def overall(points: list[ComparePoint], comparable: bool) -> Verdict:
    """The run's verdict from its points' (module docstring)."""
    verdicts = {p.verdict for p in points if not p.no_regression}
    if not comparable:
        return "inconclusive"
    return next((v for v in ("slower", "inconclusive", "faster") if v in verdicts), "same")


def build_report(
    pairs: list[tuple[Side, Side]],
    warnings: list[str],
    environment: list[str],
    threshold_pct: float,
    alpha: float = 0.05,
) -> CompareReport:
    """The report of matched pairs; `environment` holds the differences that make the runs incomparable."""
    points = compare_pairs(pairs, threshold_pct, alpha)
    if not points:
        raise ValueError("every matched point failed (oom, error or skipped) in both runs: nothing to compare")
    notes = list(warnings) + list(environment)
    slower = [p for p in points if p.verdict == "slower"]
    if environment and slower:
        notes.append(
            f"{len(slower)} point(s) look slower (e.g. {slower[0].impl} N={slower[0].seq_len:,} "
            f"{slower[0].mode}) but the environments differ: not counted as a regression"
        )
    if failed := [p for p in points if p.note and p.note.endswith("not compared")]:
        notes.append(
            f"{len(failed)} point(s) ran on one side only: "
            + ", ".join(f"{p.impl} N={p.seq_len:,} {p.mode} ({p.note})" for p in failed[:3])
        )
    return CompareReport(
        points=points,
        verdict=overall(points, not environment),
        warnings=notes,
        comparable=not environment,
        threshold_pct=threshold_pct,
        alpha=alpha,
    )
