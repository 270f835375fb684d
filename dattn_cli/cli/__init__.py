"""The `dattn` command line: options in, one library call, a renderer out.

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (one line on stderr; --debug for the
traceback), 130 interrupted. Progress goes to stderr; tables to stdout, or to stderr when `--json -` or
`--csv -` puts machine output on stdout.

Layout: app.py (the Typer app, --config/--debug/--version), options.py (every option, once), one module per
command, render/ (the tables).
"""

from __future__ import annotations

import sys

import typer

from . import bench, env, impls, plan, profile, profiles, verify
from .app import app

app.command("verify")(verify.verify)
app.command("bench")(bench.bench)
app.command("profile")(profile.profile)
app.command("plan")(plan.plan)
app.add_typer(profiles.profiles_app, name="profiles")
app.command("impls")(impls.impls)
app.command("env")(env.env)

__all__ = ["app", "main"]
INTERRUPTED = 130


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
    quoted = re.compile(r"(?<!\w)(?:'([^']{%d,})'|\"([^\"]{%d,})\")(?!\w)" % (ECHO_LIMIT + 1, ECHO_LIMIT + 1))
    message = quoted.sub(lambda m: m[0][0] + (m[1] or m[2])[:ECHO_LIMIT] + "..." + m[0][0], message)
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT - 300] + " ... " + message[-295:]
    return message


# Old option names, still accepted for a while: each use prints one deprecation line on stderr. --nproc and
# --start also collided with torchrun's own options (--nproc-per-node, --start-method) under torchrun.
DEPRECATED = {
    "bench": {"--seq-lens": "--seq-len", "--nproc": "--world-size", "--start": "--start-seq-len"},
    "plan": {"--devices": "--world-size", "--memory": "--max-memory"},
}
ROOT_OPTIONS_WITH_VALUES = ("--config",)


def rename_deprecated(args: list[str]) -> list[str]:
    """args with deprecated option names replaced by the current ones, a note on stderr for each."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ROOT_OPTIONS_WITH_VALUES else 1
    renames = DEPRECATED.get(args[i], {}) if i < len(args) else {}
    out = list(args)
    for j in range(i + 1, len(out)):
        name, eq, value = out[j].partition("=")
        if name in renames:
            print(f"dattn: note: {name} is deprecated, use {renames[name]}", file=sys.stderr)
            out[j] = renames[name] + eq + value
    return out


def main(argv: list[str] | None = None) -> None:
    args = rename_deprecated(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="dattn", standalone_mode=False)
    except Exception as exc:
        # Typer may vendor its own click, so click's exceptions are recognised by shape, not class.
        if type(exc).__name__ == "Abort":
            print("dattn: interrupted", file=sys.stderr)
            sys.exit(INTERRUPTED)
        usage = hasattr(exc, "format_message") and hasattr(exc, "exit_code")
        if debug or not (usage or isinstance(exc, ValueError)):
            raise
        # ValueError: bad configuration or input, raised by the library with the fix in its text.
        message = _one_line(exc)
        print(f"dattn: error: {message.splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        code = INTERRUPTED
    if code == INTERRUPTED:  # typer turns Ctrl-C into this exit code itself
        print("dattn: interrupted", file=sys.stderr)
    sys.exit(code if isinstance(code, int) else 0)
