"""The `dattn` command line: options in, one library call, a renderer out.

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (one line on stderr; --debug for the
traceback), and when a signal stops it, 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (one line
saying what was kept, no traceback). Inside a torchrun/srun job (runtime/heartbeat.py): 1 when a peer rank
died, 143 when the job was terminated (every rank told to stop). Progress goes to stderr; tables to stdout, or
to stderr when `--json -` or `--csv -` puts machine output on stdout.

Layout: app.py (the Typer app, --config/--debug/--version), commands.py (the app with its commands; loaded by
main, after its signal handlers), build.py (each command's options, made from the Problem's fields and
options.py, the options that are not Problem fields), deprecated.py (old option names), one module per
command, render/ (the tables).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from ..runtime.signals import Interrupted, deferred, ignore_stopping_signals, raising_interrupted, take_pending
from .deprecated import rename_deprecated

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name == "app":  # loaded on first use: main() installs its signal handlers first
        from .commands import app

        return app
    raise AttributeError(name)


ECHO_LIMIT = 200  # characters of one quoted input a message repeats (workload/parse.py: clip)
MESSAGE_LIMIT = 1000  # characters of a whole error line: head and tail kept, the middle cut


def _one_line(exc: Exception) -> str:
    """The user-facing sentence of a ValueError or a usage error, on one bounded line: pydantic's validation
    errors reduced to their message, any quoted input over ECHO_LIMIT characters cut (an alias bomb or a huge
    argument is not repeated whole), and the line cut to MESSAGE_LIMIT keeping its start (the parameter) and
    its end (the fix)."""
    import re

    from pydantic import ValidationError

    if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click's usage errors
        message = str(exc.format_message()).replace("Value error, ", "")
    elif isinstance(exc, ValidationError) and exc.errors():
        error = exc.errors()[0]
        message = str(error.get("msg", exc)).removeprefix("Value error, ")
        field = ".".join(str(p) for p in error.get("loc", ()))
        message = message if message.startswith("-") or not field else f"{field}: {message}"
    else:
        message = str(exc)
    message = next((line.strip() for line in message.splitlines() if line.strip()), "") or type(exc).__name__
    long = ECHO_LIMIT + 1
    quoted = re.compile(rf"(?<!\w)(?:'([^']{{{long},}})'|\"([^\"]{{{long},}})\")(?!\w)")
    message = quoted.sub(lambda m: m[0][0] + (m[1] or m[2])[:ECHO_LIMIT] + "..." + m[0][0], message)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 300] + " ... " + message[-295:]
    return message


def _run(args: list[str]) -> int:
    with deferred():  # a signal raised inside an extension module's initialisation aborts the process (exit -6):
        # during the start-up imports it waits for them, then stops the run as anywhere else
        import typer

        from .commands import app

    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="dattn", standalone_mode=False)
    except Exception as exc:
        # Typer may vendor its own click, so click's exceptions are recognised by shape, not class.
        if type(exc).__name__ == "Abort":  # click's form of a KeyboardInterrupt raised by other code
            raise Interrupted(signal.SIGINT) from None
        usage = hasattr(exc, "format_message") and hasattr(exc, "exit_code")
        if (signum := take_pending()) is not None:  # a signal some library swallowed, and what that broke
            raise Interrupted(signum) from None
        if debug or not (usage or isinstance(exc, ValueError)):
            raise
        # ValueError: bad configuration or input, raised by the library with the fix in its text.
        message = _one_line(exc)
        print(f"dattn: error: {message.splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    if (signum := take_pending()) is not None:  # the run went on past a signal that some library swallowed
        raise Interrupted(signum)
    return code if isinstance(code, int) else 0


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr gone with the terminal (SIGHUP) or a closed pipe
        pass


def main(argv: list[str] | None = None) -> None:
    """The `dattn` command. Ctrl-C, SIGTERM and SIGHUP raise Interrupted from the moment it starts: one line
    ("dattn: interrupted: what was kept"), exit 128 + the signal number (130, 143, 129), never a traceback."""
    with raising_interrupted():
        try:
            code = _run(rename_deprecated(sys.argv[1:] if argv is None else argv))
        except Interrupted as exc:
            ignore_stopping_signals()  # a second Ctrl-C while the message is printed changes nothing
            _say(f"dattn: {exc.message()}")
            code = exc.exit_code
    sys.exit(code)
