"""Where a benchmarks/ script writes its rows: a new report by default, an existing one only with --resume.

By default each run measures afresh into results/<script>-<date>-<time>.jsonl (relative to the current
directory; /results/ is git-ignored). `--out FILE` names the report instead; a FILE that already holds rows
is refused unless `--resume` is given (bench's own rule, message included), and with --resume the points
already in FILE are not measured again: `--out benchmarks/<shipped>.jsonl --resume` reprints the shipped
figures without measuring anything.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dattn_cli.bench import Sweep, SweepResult, run_sweep


def add_resume_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the report given by --out: points already in it are not measured again "
        "(without --resume a report that already holds rows is refused)",
    )


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, **kwargs) -> None:
    """`old` still accepted in place of `new` (same destination), with a one-line note on stderr."""

    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(f"{parser.prog}: note: {old} is deprecated, use {new}", file=sys.stderr)
            setattr(namespace, self.dest, values)

    parser.add_argument(
        old,
        dest=new.lstrip("-").replace("-", "_"),
        action=Renamed,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
        **kwargs,
    )


def new_report_path(stem: str, suffix: str = ".jsonl") -> Path:
    """results/<stem>-<date>-<time><suffix>: a file no earlier run wrote."""
    path = Path("results") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"
    n = 1
    while path.exists():
        n += 1
        path = path.with_name(f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{n}{suffix}")
    return path


def report_path(
    parser: argparse.ArgumentParser, out: Path | None, resume: bool, stem: str, option: str = "--out"
) -> Path:
    """The report to write: `out`, or a new results/ file; --resume without a report to continue is an error."""
    if out is None:
        if resume:
            parser.error(f"--resume continues an existing report: give it with {option} FILE")
        return new_report_path(stem)
    return out


class Report:
    """One JSONL report of a script, filled by one or more sweeps: the first sweep starts it (or, with --resume,
    continues it), the following sweeps of the same run continue it."""

    def __init__(self, parser: argparse.ArgumentParser, path: Path, resume: bool, command: list[str]):
        self.parser, self.path, self.resume, self.command = parser, path, resume, command
        self.started = False

    def sweep(self, cfg: Sweep, **kwargs) -> SweepResult:
        try:
            result = run_sweep(cfg, out=self.path, resume=self.resume or self.started, command=self.command, **kwargs)
        except ValueError as exc:  # e.g. --out already holds rows and no --resume: bench's own sentence
            self.parser.exit(2, f"{self.parser.prog}: error: {exc}\n")
        self.started = True
        return result


def script_command() -> list[str]:
    """The command line as run, for the report's environment record."""
    return ["python", *sys.argv]
