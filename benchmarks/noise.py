"""A/A false alarms and the detection of a known slowdown: does `dattn compare` say "slower" only when it is?

Issue 17, item 7. Scenarios (--scenario, repeatable; all four by default), each --pairs P times (interleave:
--interleave-pairs):

1. quiet: two identical `dattn bench --out` runs, then `dattn compare BASE NEW --threshold T`; exit 1 is a
   false alarm.
2. loaded: the same with NEW under steady load (--load-procs busy processes started by this script); exit 1
   is a false alarm, exit 3 with the load named is the right answer.
3. slowdown: the NEW report of a quiet pair (scenario 1's when it ran) copied with every point's times
   multiplied by 1 + S (--slowdown, 25%) and compared with its BASE: exit 1 = detected, counted over the
   comparable pairs (no point flagged contended or throttled by the bench, environments alike). The same
   with a change below the threshold (--small-slowdown, 5%): exit 1 is a false alarm.
4. interleave: `dattn bench --interleave` of the first two --impl at --interleave-seq-len quiet, then under
   intermittent load (--load-period ON,OFF seconds); the ratio of their medians must stay within 10% of the
   quiet one, or the loaded run's rows be flagged (contended, or noisy with the reason).

Targets (issue 17): exit 1 in <= 5% of the pairs quiet, one side loaded, and for the change below the
threshold; the slowdown detected in >= 95% of comparable pairs; no interleaved ratio shifted beyond 10%
without a flag.

    python benchmarks/noise.py                    # the defaults: ~45 min on 2 cores
    python benchmarks/noise.py --threads 1 --scenario quiet --scenario slowdown   # threads that fit a busy machine
    python benchmarks/noise.py --scenario slowdown --pairs 1 --seq-len 512 --repeat 6   # a quick look
    python benchmarks/noise.py --out results/noise.jsonl --resume   # continue an interrupted run

Every bench and compare runs as a user runs it, `python -m dattn_cli ...` in a subprocess; their reports and
logs go to --runs-dir (default results/noise-runs/<report name>/). Results: a run record, one record per
pair (exit codes, verdicts, command lines, load, what the bench flagged, and as a diagnostic the exit code
compare's statistics alone give with the bench's flags left out: exit_code_unflagged) and a summary per scenario, in
results/noise-<time>.jsonl unless --out names it; a table per scenario on stderr. Exit 0 when every target
holds; 1 when one misses or could not be tested (named); 2 on bad options; 128 + the signal when
interrupted (the load stopped, the pairs kept for --resume).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sys
import time
from importlib import metadata
from pathlib import Path

from _noise_runs import BadInput, Failed, Runner, interleave_available, read_records
from _noise_scenarios import SCENARIOS, Plan, pair_aa, pair_interleave, pair_slowdown, summarize
from _reports import add_resume_option, report_path

IMPLS = ["ImprovedDilatedAttention", "sdpa"]
WORKLOAD = ("impl", "seq_len", "mode", "heads", "head_dim", "segments", "dilations", "repeat", "max_seconds", "threads")
TIMEOUT_S = 1800.0  # one bench or compare run; the steady load's own deadline too
SETTINGS = WORKLOAD + ("interleave_seq_len", "threshold", "slowdown", "small_slowdown", "load_procs", "load_period")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # once: the clean-up must not be cut short
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def build_parser() -> Parser:
    p = Parser(prog="noise.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable (default: all four)")
    p.add_argument("--pairs", type=int, default=10, help="pairs per scenario (default 10)")
    p.add_argument("--interleave-pairs", type=int, default=3, help="pairs of scenario interleave (default 3)")
    p.add_argument("--impl", action="append", help=f"repeatable (default: {' and '.join(IMPLS)})")
    p.add_argument("--seq-len", default="2k,4k")
    p.add_argument("--interleave-seq-len", default="8k", help="N of scenario interleave (default 8k)")
    p.add_argument("--mode", default="fwd", choices=("fwd", "fwdbwd"))
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--segments", default="512,1024")
    p.add_argument("--dilations", default="1,2")
    p.add_argument("--repeat", type=int, default=None, help="timed calls per point (default: dattn's --precision)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="bench's time budget per point (per line with --interleave); default 30",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="bench --threads of every run (default: bench's, which leaves a CPU free)",
    )
    p.add_argument("--threshold", type=float, default=10.0, help="compare --threshold PCT (default 10)")
    p.add_argument("--slowdown", type=float, default=25.0, help="injected slowdown, percent (default 25)")
    p.add_argument("--small-slowdown", type=float, default=5.0, help="injected change below --threshold (default 5)")
    p.add_argument("--load-procs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per CPU)")
    p.add_argument("--load-period", default="2,2", help="intermittent load: ON,OFF seconds (default 2,2)")
    p.add_argument("--out", type=Path, default=None, help="JSONL results (default: a new results/noise-<time>.jsonl)")
    add_resume_option(p)
    p.add_argument(
        "--runs-dir", type=Path, default=None, help="bench reports and logs (default results/noise-runs/<out name>)"
    )
    return p


def _positive(p: Parser, option: str, value: float | None, minimum: float = 0.0, strict: bool = True) -> None:
    if isinstance(value, int) and value < 1:
        p.error(f"{option} must be at least 1, got {value}")
    if value is not None and not (math.isfinite(value) and (value > minimum if strict else value >= minimum)):
        p.error(f"{option} must be a finite number {'>' if strict else '>='} {minimum:g}, got {value:g}")


def check_args(p: Parser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse bad options in one line naming the option (exit 2); fill the defaults that depend on others."""
    args.scenario = list(dict.fromkeys(args.scenario or SCENARIOS))
    args.impl = args.impl or list(IMPLS)
    for option in ("--pairs", "--interleave-pairs", "--heads", "--head-dim", "--load-procs", "--threads"):
        _positive(p, option, getattr(args, option[2:].replace("-", "_")))
    if args.load_procs > 4 * (os.cpu_count() or 1):
        p.error(f"--load-procs {args.load_procs}: at most 4 per CPU ({4 * (os.cpu_count() or 1)} here)")
    if args.repeat is not None and args.repeat < 4:
        p.error(f"--repeat {args.repeat}: dattn compare needs at least 4 timed calls a side; give 4 or more")
    _positive(p, "--max-seconds", args.max_seconds)
    _positive(p, "--threshold", args.threshold)
    _positive(p, "--small-slowdown", args.small_slowdown, strict=False)
    if not (math.isfinite(args.slowdown) and args.slowdown > args.threshold):
        p.error(
            f"--slowdown {args.slowdown:g} must be above --threshold {args.threshold:g}: a smaller change "
            "is not one compare may call a regression"
        )
    if not args.small_slowdown < args.threshold:
        p.error(f"--small-slowdown {args.small_slowdown:g} must be below --threshold {args.threshold:g}")
    try:
        args.on_s, args.off_s = (float(v) for v in args.load_period.split(","))
    except ValueError:
        p.error(f"--load-period {args.load_period!r}: give ON,OFF seconds, e.g. 2,2")
    _positive(p, "--load-period ON", args.on_s)
    _positive(p, "--load-period OFF", args.off_s)
    from dattn_cli.workload import parse_seq_lens  # here: torch loads with it, after the cheaper checks

    lengths = {}
    for option, value in (("--seq-len", args.seq_len), ("--interleave-seq-len", args.interleave_seq_len)):
        try:
            lengths[option] = parse_seq_lens(value)
        except ValueError as exc:  # its sentence names --seq-len: name the option given here
            p.error(f"{option}: {str(exc).split(': ', 1)[-1]}")
    if len(lengths["--interleave-seq-len"]) != 1:
        p.error(f"--interleave-seq-len {args.interleave_seq_len}: give one length, e.g. 8k")
    args.interleave_n = lengths["--interleave-seq-len"][0]
    if "interleave" in args.scenario and len(args.impl) < 2:
        p.error(
            "scenario interleave compares the first two --impl: give two (e.g. --impl ImprovedDilatedAttention "
            "--impl sdpa)"
        )
    return args


def bench_args(args: argparse.Namespace) -> list[str]:
    """The options every bench run gets (the A/A runs add --impl and --seq-len, interleave its own)."""
    out = [
        "--mode",
        args.mode,
        "--heads",
        str(args.heads),
        "--head-dim",
        str(args.head_dim),
        "--segments",
        args.segments,
        "--dilations",
        args.dilations,
        "--max-seconds",
        f"{args.max_seconds:g}",
    ]
    return (
        out
        + (["--repeat", str(args.repeat)] if args.repeat else [])
        + (["--threads", str(args.threads)] if args.threads else [])
    )


def settings(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in SETTINGS}


class Results:
    """The JSONL results: a run record first, then pair and summary records, each line flushed to disk."""

    def __init__(self, p: Parser, path: Path, resume: bool, run: dict):
        self.path, self.done = path, {}
        held = read_records(path) if path.is_file() and path.stat().st_size else []
        if held and not resume:
            p.error(f"--out {path} already holds results: pass --resume to continue it, or another --out")
        for record in held:
            if record.get("record") == "run" and record.get("settings") != run["settings"]:
                changed = [k for k in SETTINGS if record["settings"].get(k) != run["settings"].get(k)]
                p.error(
                    f"--resume: {path} was measured with other settings ({', '.join(changed)}): "
                    "give the same options, or another --out"
                )
            if record.get("record") == "pair":
                self.done[(record["scenario"], record["pair"])] = record
        self.new_file, self.pairs = not held, len(self.done)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.append(run)

    def append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.pairs += record.get("record") == "pair"

    def discard_if_empty(self) -> None:
        """Remove a file this run started and wrote no pair to (bad input found by dattn)."""
        if self.new_file and self.pairs == 0:
            self.path.unlink(missing_ok=True)


def run_record(args: argparse.Namespace) -> dict:
    return {
        "record": "run",
        "command": " ".join(["python", *sys.argv]),
        "settings": settings(args),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": metadata.version("torch"),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def run_pair(scenario: str, i: int, runner: Runner, plan: Plan) -> dict:
    started = time.monotonic()
    try:
        if scenario in ("quiet", "loaded"):
            record = pair_aa(runner, plan, scenario, i)
        elif scenario == "slowdown":
            record = pair_slowdown(runner, plan, i)
        else:
            record = pair_interleave(runner, plan, i)
    except Failed as exc:
        record = {"scenario": scenario, "pair": i, "error": str(exc)}
    return {"record": "pair", **record, "seconds": round(time.monotonic() - started, 1)}


def show_pair(record: dict) -> None:
    if "error" in record:
        line = f"error: {record['error']}"
    elif record["scenario"] == "interleave":
        r_q, r_l = record["ratio_quiet"], record["ratio_loaded"]
        line = f"ratio quiet {r_q or 0:.3f}, loaded {r_l or 0:.3f}: {record['outcome']}"
    else:
        line = f"exit {record['exit_code']} ({record['verdict']})"
        if record["scenario"] == "slowdown":
            line += f", comparable {record['comparable']}; small change: exit {record['small_exit_code']}"
    print(
        f"  {record['scenario']} pair {record['pair'] + 1}: {line} [{record['seconds']:.0f} s]",
        file=sys.stderr,
        flush=True,
    )


def show_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"noise: {summary['scenario']}")
    for column in ("pairs", "errors", "exit codes", "target", "measured", "result"):
        table.add_column(column)
    codes = ", ".join(f"{k}: {v}" for k, v in sorted(summary["exit_codes"].items())) or "-"
    for n, target in enumerate(summary["targets"]):
        first = (str(summary["pairs"]), str(summary["errors"]), codes) if n == 0 else ("", "", "")
        table.add_row(*first, f"{target['name']}: {target['target']}", target["shown"], target["result"])
    Console(stderr=True, width=150).print(table)
    if summary["figures"]:
        print("  " + json.dumps(summary["figures"]), file=sys.stderr, flush=True)


def run_scenario(scenario: str, count: int, runner: Runner, plan: Plan, results: Results) -> dict:
    records = []
    for i in range(count):
        record = results.done.get((scenario, i))
        if record is None:
            record = run_pair(scenario, i, runner, plan)
            results.append(record)
        show_pair(record)
        records.append(record)
    summary = summarize(scenario, records)
    results.append(summary)
    show_summary(summary)
    return summary


def make_plan(args: argparse.Namespace) -> Plan:
    return Plan(
        threshold=args.threshold,
        slowdown=args.slowdown,
        small_slowdown=args.small_slowdown,
        load_procs=args.load_procs,
        load_on_s=args.on_s,
        load_off_s=args.off_s,
        impl_a=args.impl[0],
        impl_b=args.impl[1] if len(args.impl) > 1 else args.impl[0],
        interleave_seq_len=args.interleave_n,
        load_deadline_s=TIMEOUT_S,
    )


def run_all(args: argparse.Namespace, results: Results, runs_dir: Path) -> list[str]:
    """Every scenario asked for; the targets that missed (empty: all hold)."""
    workload = [*(w for impl in args.impl for w in ("--impl", impl)), "--seq-len", args.seq_len]
    runner = Runner(workload, bench_args(args), runs_dir, TIMEOUT_S)
    plan = make_plan(args)
    missed = []
    for scenario in args.scenario:
        if scenario == "interleave" and not interleave_available():
            print("noise: interleave skipped: bench has no --interleave yet", file=sys.stderr)
            results.append({"record": "summary", "scenario": scenario, "skipped": "bench has no --interleave yet"})
            continue
        count = args.interleave_pairs if scenario == "interleave" else args.pairs
        summary = run_scenario(scenario, count, runner, plan, results)
        missed += [
            f"{scenario}: {t['name']} ({t['target']}): {t['shown']} {t['result']}"
            for t in summary["targets"]
            if t["result"] != "PASS"
        ]
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = check_args(parser, parser.parse_args(argv))
    out = report_path(parser, args.out, args.resume, "noise")
    runs_dir = args.runs_dir or Path("results") / "noise-runs" / out.stem
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    results = Results(parser, out, args.resume, run_record(args))
    try:
        missed = run_all(args, results, runs_dir)
    except BadInput as exc:
        results.discard_if_empty()
        print(f"noise.py: error: dattn refused an option: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(
            f"noise.py: interrupted ({exc}); the load is stopped; {results.pairs} pair(s) kept in {out}: rerun "
            f"with --out {out} --resume",
            file=sys.stderr,
        )
        return 128 + exc.signum
    print(f"noise: results in {out}, bench reports in {runs_dir}", file=sys.stderr)
    for line in missed:
        print(f"noise: target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
