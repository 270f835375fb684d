"""Consoles, progress bars and the number formats every table shares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

stdout = Console(width=None if sys.stdout.isatty() else 120)  # logs and pipes get full tables


def stderr_console() -> Console:
    return Console(stderr=True)


def note(text: str) -> None:
    """A line for people on stderr (rich markup allowed)."""
    stderr_console().print(text)


def progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr_console(), transient=True,
    )


def emit(target: str, text: str) -> None:
    """Text to a file, or to stdout for '-'."""
    if target == "-":
        print(text, end="" if text.endswith("\n") else "\n")
    else:
        Path(target).write_text(text)


def emit_json(target: str, payload: object) -> None:
    emit(target, json.dumps(payload, indent=1, default=str))


def fmt_error(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1e}"


def size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
