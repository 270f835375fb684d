"""Where output goes, progress, and the number formats every table shares.

Tables and summaries go to stdout, unless machine output (`--json -`, `--csv -`) claims stdout: then they go
to stderr, so that `dattn plan ... --json - | python -m json.tool` reads JSON alone. Progress always goes to
stderr: rich bars on a terminal, one line per step when stderr is a log or a pipe, nothing with --quiet.

User text (names from profiles, reports and plugins, paths, error messages) is never read as rich markup:
notes and progress lines print literally, and renderers pass such text through `literal` into table cells
and titles, so a name like "[/bold]" prints as written instead of raising MarkupError.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

WIDTH = 120  # logs and pipes get full tables


def tolerant(stream: Any) -> Any:
    """`stream`, set to replace what its encoding cannot write (a name in Unicode on an ASCII terminal prints
    with '?' instead of failing the command after its work is done)."""
    if getattr(stream, "encoding", "utf-8").lower().replace("-", "") != "utf8" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="replace")
        except (OSError, ValueError):
            pass
    return stream


class _Tables:
    """The console results are printed on: stdout, or stderr while stdout carries machine output."""

    def __init__(self) -> None:
        self.to_stderr = False
        self.quiet = False

    def console(self) -> Console:
        return _console(sys.stderr if self.to_stderr else sys.stdout)

    def print(self, *objects: Any, **options: Any) -> None:
        self.console().print(*objects, **options)


stdout = _Tables()


def machine_output(*targets: str | None) -> None:
    """Call before printing: a '-' among the machine-output targets moves tables and notes to stderr."""
    if sum(target == "-" for target in targets) > 1:
        raise ValueError(
            "more than one output wants stdout ('-'): send all but one of --json, --csv, --junit and "
            "--markdown to a file"
        )
    stdout.to_stderr = any(target == "-" for target in targets)


def set_quiet(quiet: bool) -> None:
    stdout.quiet = quiet


def _console(stream: Any) -> Console:
    return Console(file=tolerant(stream), width=None if stream.isatty() else WIDTH)


def stderr_console() -> Console:
    return _console(sys.stderr)


def note(text: str, style: str | None = None) -> None:
    """A line for people on stderr, printed literally (no markup: it often holds paths and names), in `style`."""
    stderr_console().print(text, style=style, markup=False)


def literal(value: object) -> str:
    """User text for a markup string (a table cell or title): shown as written, never read as markup."""
    return escape(str(value))


class LineProgress:
    """Progress for logs: one line per completed step, '[3/12] what happened', flushed at once."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tasks: dict[int, dict] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        self.tasks[len(self.tasks)] = {"total": total, "completed": 0, "description": description}
        return len(self.tasks) - 1

    def update(self, task: int, advance: float = 0, description: str | None = None, **_: Any) -> None:
        state = self.tasks[task]
        state["completed"] += advance
        if description is not None:
            state["description"] = description
        if advance and not self.quiet:
            total = f"/{int(state['total'])}" if state["total"] else ""
            print(f"[{int(state['completed'])}{total}] {state['description']}", file=sys.stderr, flush=True)


def progress(quiet: bool | None = None) -> Progress | LineProgress:
    """A rich bar when stderr is a terminal; else one line per step; silent with --quiet."""
    quiet = stdout.quiet if quiet is None else quiet
    if quiet or not sys.stderr.isatty():
        return LineProgress(quiet=quiet)
    return Progress(
        TextColumn("{task.description}", markup=False, style="progress.description"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console(),
        transient=True,
    )


def emit(target: str, text: str) -> None:
    """Text to a file, or to stdout for '-'."""
    if target == "-":
        tolerant(sys.stdout).write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    else:
        try:
            Path(target).write_text(text)
        except OSError as exc:  # a missing folder, a directory, no permission, a full disk: one line, exit 2
            raise ValueError(
                f"{target}: cannot write it ({exc.strerror or exc}); give a file in a folder that "
                "exists and can be written, or '-' for stdout"
            ) from None


def emit_json(target: str, payload: object) -> None:
    emit(target, json.dumps(payload, indent=1, default=str))


def emit_files(json_out: str | None, csv_out: str | None, payload: object, records: list[dict]) -> None:
    """`payload` to --json and `records` to --csv, each where it was asked for."""
    if json_out:
        emit_json(json_out, payload)
    if csv_out:
        emit_csv(csv_out, records)


def emit_csv(target: str, records: list[dict]) -> None:
    """One CSV line per record; nested fields become dotted columns (errors.out.rel), lists stay one cell."""
    import pandas as pd

    emit(target, pd.json_normalize(records).to_csv(index=False))


def size(nbytes: int | None) -> str:
    """Bytes in the largest binary unit; "-" for none, "n/a" for a value that is not a size (NaN, infinite,
    negative), so such a figure never reaches a table as a number."""
    if nbytes is None:
        return "-"
    if not _finite(nbytes) or nbytes < 0:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}" if _finite(value) else "n/a"


def _finite(value: object) -> bool:
    """A finite number (NaN, infinities, text and what is not a number are not)."""
    try:
        return not isinstance(value, str) and math.isfinite(float(value))
    except (OverflowError, TypeError, ValueError):
        return False


def heads_label(heads: int, kv_heads: int | None) -> str:
    """H=8, or with GQA/MQA H=8 H_kv=2."""
    return f"H={heads}" + (f" H_kv={kv_heads}" if kv_heads is not None else "")
