"""The four scenarios of benchmarks/noise.py, one pair at a time, and each scenario's summary against its targets.

A pair function returns the pair's record (exit codes, verdicts, what the bench flagged, command lines, load);
`summarize` turns a scenario's records into its figures and targets, each PASS, FAIL or UNTESTED (nothing to
count it on, e.g. no comparable pair).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass

from _noise_load import Intermittent, Spinners
from _noise_runs import Runner, complete, point_rows, report_facts, statistical_exit, write_slowed

SCENARIOS = ("quiet", "loaded", "slowdown", "interleave")
FALSE_ALARM_MAX = 0.05
DETECTION_MIN = 0.95
RATIO_TOLERANCE = 0.10
LOAD_WORDS = re.compile(r"load|other processes|busy|contend", re.I)


@dataclass(frozen=True)
class Plan:
    """What a pair measures and compares with (from the options)."""

    threshold: float
    slowdown: float  # percent
    small_slowdown: float  # percent
    load_procs: int
    load_on_s: float
    load_off_s: float
    impl_a: str
    impl_b: str
    interleave_seq_len: int
    load_deadline_s: float


def _points(data: dict) -> list[dict]:
    keep = ("impl", "seq_len", "ratio", "ci_low", "ci_high", "p_value", "verdict")
    return [
        {**{k: p.get(k) for k in keep}, "flagged": "flagged noisy" in (p.get("note") or "")}
        for p in data.get("points", [])
    ]


def _load_named(data: dict) -> bool:
    texts = list(data.get("warnings", [])) + [p.get("note") or "" for p in data.get("points", [])]
    return any(LOAD_WORDS.search(t) for t in texts)


def _compared(code: int, data: dict) -> dict:
    return {
        "exit_code": code,
        "verdict": data.get("verdict"),
        "comparable": data.get("comparable"),
        "load_named": _load_named(data),
        "warnings": data.get("warnings", []),
        "points": _points(data),
    }


def pair_aa(runner: Runner, plan: Plan, scenario: str, i: int) -> dict:
    """Scenarios quiet and loaded: BASE quiet, NEW quiet or under steady load, then compare."""
    base, new = runner.path(f"{scenario}-{i}-base"), runner.path(f"{scenario}-{i}-new")
    load = Spinners(plan.load_procs, plan.load_deadline_s) if scenario == "loaded" else None
    commands = [runner.bench(base), runner.bench(new, load=load)]
    code, data, cmd = runner.compare(base, new, f"{scenario}-{i}", plan.threshold)
    record = {
        "scenario": scenario,
        "pair": i,
        **_compared(code, data),
        "exit_code_unflagged": statistical_exit(base, new, plan.threshold),
        "commands": commands + [cmd],
        "facts": {"base": report_facts(base), "new": report_facts(new)},
    }
    if load is not None:
        record["load"] = {"kind": "steady", "procs": plan.load_procs, "side": "new"}
    return record


def _quiet_reports(runner: Runner, i: int) -> tuple:
    """The quiet pair i of scenario quiet when it ran to its end, else measured now (commands empty if reused)."""
    base, new = runner.path(f"quiet-{i}-base"), runner.path(f"quiet-{i}-new")
    if complete(base) and complete(new):
        return base, new, []
    return base, new, [runner.bench(base), runner.bench(new)]


def pair_slowdown(runner: Runner, plan: Plan, i: int) -> dict:
    """Scenario slowdown: NEW of a quiet pair slowed by S% (detected: exit 1) and by the small S% (exit 1: a
    false alarm), each compared with its BASE."""
    base, new, commands = _quiet_reports(runner, i)
    results, unflagged = {}, {}
    for name, pct in (("slow", plan.slowdown), ("small", plan.small_slowdown)):
        slowed = runner.path(f"slowdown-{i}-new-x{1 + pct / 100:g}")
        write_slowed(new, slowed, 1 + pct / 100)
        code, data, cmd = runner.compare(base, slowed, f"slowdown-{i}-{name}", plan.threshold)
        commands += [f"(copy of {new.name} with every point's times x{1 + pct / 100:g} -> {slowed.name})", cmd]
        results[name] = (code, data)
        unflagged[name] = statistical_exit(base, slowed, plan.threshold)
    facts = {"base": report_facts(base), "new": report_facts(new)}
    flagged = any(f["contended"] or f["throttled"] for f in facts.values())
    code, data = results["slow"]
    small_code, small_data = results["small"]
    return {
        "scenario": "slowdown",
        "pair": i,
        **_compared(code, data),
        "comparable": bool(data.get("comparable")) and not flagged,
        "slowdown_pct": plan.slowdown,
        "small_slowdown_pct": plan.small_slowdown,
        "small_exit_code": small_code,
        "small_verdict": small_data.get("verdict"),
        "small_points": _points(small_data),
        "exit_code_unflagged": unflagged["slow"],
        "small_exit_code_unflagged": unflagged["small"],
        "commands": commands,
        "facts": facts,
    }


def _ratio(rows: list[dict], plan: Plan) -> float | None:
    times = {
        r["impl"]: r.get("time_ms")
        for r in rows
        if r.get("seq_len") == plan.interleave_seq_len and r.get("status") == "ok"
    }
    a, b = times.get(plan.impl_a), times.get(plan.impl_b)
    return a / b if a and b else None


def _flags(rows: list[dict]) -> list[str]:
    """Why the bench says the rows are not to be trusted: contention first, then any noisy reason."""
    reasons = []
    for r in rows:
        if r.get("contended"):
            reasons.append(f"{r['impl']}: contended (other processes kept {r.get('other_cpus') or 0:.1f} CPUs busy)")
        elif r.get("noisy") and r.get("noisy_reason"):
            reasons.append(f"{r['impl']}: noisy ({r['noisy_reason'][:120]})")
    return reasons


def pair_interleave(runner: Runner, plan: Plan, i: int) -> dict:
    """Scenario interleave: A/B ratio of an interleaved run quiet, then under intermittent load."""
    quiet, loaded = runner.path(f"interleave-{i}-quiet"), runner.path(f"interleave-{i}-loaded")
    workload = ["--interleave", "--impl", plan.impl_a, "--impl", plan.impl_b, "--seq-len", str(plan.interleave_seq_len)]
    load = Intermittent(plan.load_procs, plan.load_on_s, plan.load_off_s)
    commands = [runner.bench(quiet, workload=workload), runner.bench(loaded, load=load, workload=workload)]
    quiet_rows, loaded_rows = point_rows(quiet), point_rows(loaded)
    r_quiet, r_loaded = _ratio(quiet_rows, plan), _ratio(loaded_rows, plan)
    shift = r_loaded / r_quiet - 1 if r_quiet and r_loaded else None
    flags = _flags(loaded_rows)
    kind = "contended" if any(": contended (" in f for f in flags) else ("spread" if flags else None)
    if shift is None:
        outcome = "no ratio"
    elif abs(shift) <= RATIO_TOLERANCE:
        outcome = "within"
    else:
        outcome = "flagged" if flags else "shifted"
    return {
        "scenario": "interleave",
        "pair": i,
        "ratio_quiet": r_quiet,
        "ratio_loaded": r_loaded,
        "shift": shift,
        "outcome": outcome,
        "flagged": bool(flags),
        "flag_kind": kind,
        "flags": flags,
        "reference_flags": _flags(quiet_rows),
        "commands": commands,
        "facts": {"quiet": report_facts(quiet), "loaded": report_facts(loaded)},
        "load": {
            "kind": "intermittent",
            "procs": plan.load_procs,
            "on_s": plan.load_on_s,
            "off_s": plan.load_off_s,
            "cycles": load.cycles,
        },
    }


# --- summaries ---------------------------------------------------------------------------------------------


def _target(name: str, goal: str, value: float | None, holds: bool | None, shown: str) -> dict:
    result = "UNTESTED" if holds is None else ("PASS" if holds else "FAIL")
    return {"name": name, "target": goal, "value": value, "shown": shown, "result": result}


def _rate(count: int, total: int) -> float | None:
    return count / total if total else None


def _share(count: int, total: int) -> str:
    return f"{count}/{total}" + (f" = {count / total:.0%}" if total else "")


def _alarm_target(name: str, alarms: int, total: int) -> dict:
    rate = _rate(alarms, total)
    return _target(
        name,
        f"exit 1 in <= {FALSE_ALARM_MAX:.0%} of pairs",
        rate,
        None if rate is None else rate <= FALSE_ALARM_MAX,
        _share(alarms, total),
    )


def _slowdown_targets(done: list[dict]) -> tuple[dict, list[dict]]:
    comparable = [r for r in done if r.get("comparable")]
    detected = sum(r["exit_code"] == 1 for r in comparable)
    rate = _rate(detected, len(comparable))
    small = sum(r.get("small_exit_code") == 1 for r in done)
    pct, small_pct = done[0]["slowdown_pct"], done[0]["small_slowdown_pct"]
    figures = {
        "comparable": len(comparable),
        "detected": detected,
        "detected_all": sum(r["exit_code"] == 1 for r in done),
        "detected_unflagged": sum(r.get("exit_code_unflagged") == 1 for r in done),
        "small_alarms_unflagged": sum(r.get("small_exit_code_unflagged") == 1 for r in done),
        "small_exit_codes": dict(Counter(str(r.get("small_exit_code")) for r in done)),
    }
    targets = [
        _target(
            f"{pct:g}% slowdown detected",
            f"exit 1 in >= {DETECTION_MIN:.0%} of comparable pairs",
            rate,
            None if rate is None else rate >= DETECTION_MIN,
            _share(detected, len(comparable)),
        ),
        _alarm_target(f"{small_pct:g}% change (below threshold) flagged", small, len(done)),
    ]
    return figures, targets


def _interleave_targets(done: list[dict]) -> tuple[dict, list[dict]]:
    outcomes = Counter(r["outcome"] for r in done)
    counted = [r for r in done if r["outcome"] != "no ratio"]
    bad = outcomes["shifted"]
    shifts = [r["shift"] for r in counted]
    figures = {
        "outcomes": dict(outcomes),
        "flag_kinds": dict(Counter(r.get("flag_kind") or "none" for r in done)),
        "reference_flagged": sum(bool(r.get("reference_flags")) for r in done),
        "median_ratio_quiet": statistics.median([r["ratio_quiet"] for r in counted]) if counted else None,
        "max_abs_shift": max((abs(s) for s in shifts), default=None),
    }
    goal = f"ratio within {RATIO_TOLERANCE:.0%} of quiet, or flagged, in every pair"
    holds = None if not counted else bad == 0
    return figures, [
        _target(
            "interleaved ratio under intermittent load",
            goal,
            _rate(bad, len(counted)),
            holds,
            f"{len(counted) - bad}/{len(counted)} ok ({outcomes['within']} within, "
            f"{outcomes['flagged']} flagged, {bad} shifted unflagged)",
        )
    ]


def summarize(scenario: str, records: list[dict]) -> dict:
    """The scenario's summary record: pairs, errors, exit codes, figures and targets."""
    done = [r for r in records if "error" not in r]
    summary = {
        "record": "summary",
        "scenario": scenario,
        "pairs": len(done),
        "errors": len(records) - len(done),
        "exit_codes": dict(Counter(str(r["exit_code"]) for r in done if "exit_code" in r)),
    }
    if not done:
        return {**summary, "figures": {}, "targets": [_target(scenario, "at least one pair", None, None, "0 pairs")]}
    if scenario in ("quiet", "loaded"):
        alarms = sum(r["exit_code"] == 1 for r in done)
        figures = {
            "false_alarms": alarms,
            "false_alarms_unflagged": sum(r.get("exit_code_unflagged") == 1 for r in done),
            "exit_codes_unflagged": dict(Counter(str(r.get("exit_code_unflagged")) for r in done)),
        }
        if scenario == "loaded":
            figures["inconclusive_load_named"] = sum(r["exit_code"] == 3 and r["load_named"] for r in done)
        targets = [_alarm_target(f"A/A false alarms ({scenario})", alarms, len(done))]
    elif scenario == "slowdown":
        figures, targets = _slowdown_targets(done)
    else:
        figures, targets = _interleave_targets(done)
    return {**summary, "figures": figures, "targets": targets}
