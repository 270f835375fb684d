"""The `dattn` command line: options in, one library call, a renderer out (SPEC §4).

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (one line on stderr; --debug for the
traceback). Progress goes to stderr, tables and data to stdout.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .envinfo import collect_environment
from .render import env_table, stderr_console, verify_summary, verify_table, verify_warnings

app = typer.Typer(
    name="dattn",
    help="Verify, benchmark, profile and capacity-plan long-context dilated attention.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
stdout = Console()


class UsageError(ValueError):
    """Bad input that is the user's to fix: one line, exit code 2."""


def _load_config(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"--config {path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of command names to options, e.g. 'verify: {{dtype: float32}}'")
    return data


def _config_default_map(ctx: typer.Context, data: dict, path: Path) -> dict:
    commands = getattr(ctx.command, "commands", {})
    default_map = {}
    for command, options in data.items():
        sub = commands.get(command)
        if sub is None:
            raise UsageError(f"--config {path}: unknown command {command!r}; use one of {', '.join(commands)}")
        if not isinstance(options, dict):
            raise UsageError(f"--config {path}: '{command}' must map option names to values")
        names = {p.name for p in sub.params}
        entry = {}
        for key, value in options.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise UsageError(f"--config {path}: '{command}' has no option {key!r}; see 'dattn {command} --help'")
            entry[name] = value
        default_map[command] = entry
    return default_map


def _version(value: bool) -> None:
    if value:
        stdout.print(f"dattn {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file of options per command (the CLI wins)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if config is not None:
        ctx.default_map = _config_default_map(ctx, _load_config(config), config)


class Semantics(str, Enum):
    longnet = "longnet"
    head_groups = "head_groups"
    both = "both"


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"
    bfloat16 = "bfloat16"
    float16 = "float16"


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr_console(), transient=True,
    )


@app.command()
def verify(
    impl: Optional[list[str]] = typer.Option(None, "--impl", help="Implementation to check (repeatable; default: all single-device)."),
    full: bool = typer.Option(False, "--full/--quick", help="Full case matrix, or the quick one (default)."),
    dtype: DType = typer.Option(DType.float32, "--dtype", help="Input dtype."),
    semantics: Semantics = typer.Option(Semantics.both, "--semantics", help="Head/pair preset to check."),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Only causal, or only non-causal."),
    both: bool = typer.Option(False, "--both", help="Causal and non-causal (the default)."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="Attention backend (repeatable): auto, math, sdpa, flash."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full report as JSON to this file."),
    details: bool = typer.Option(False, "--details", help="One table row per case, not per implementation."),
) -> None:
    """Equivalence of every implementation against the dense reference, forward and gradients."""
    from .verify import case_matrix, run_verify

    if both and causal is not None:
        raise UsageError("--both conflicts with --causal/--no-causal: give one of them")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available here; use --device cpu")
    elif device != "cpu":
        raise UsageError(f"--device {device!r}: use cpu or cuda")
    sems = ["longnet", "head_groups"] if semantics == Semantics.both else [semantics.value]
    causals = [False, True] if causal is None else [causal]
    cases = case_matrix(full)
    with _progress() as progress:
        task = progress.add_task("verify", total=None)
        report = run_verify(
            impl, full=full, dtype=dtype.value, semantics=sems, causal=causals, backends=backend, device=device,
            seed=seed, cases=cases, on_result=lambda r: progress.advance(task),
        )
    stdout.print(verify_table(report, details))
    for line in verify_warnings(report):
        stderr_console().print(f"[yellow]{line}[/]")
    stdout.print(verify_summary(report))
    if json_out is not None:
        report.environment = {**collect_environment().model_dump(), "command": ["dattn", *sys.argv[1:]]}
        json_out.write_text(report.model_dump_json(indent=1))
    if not report.passed:
        raise typer.Exit(code=1)


@app.command()
def env(json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """torch, devices (via NVML), attention backends found here."""
    info = collect_environment()
    if json_:
        print(json.dumps(info.model_dump(), indent=1))
    else:
        stdout.print(env_table(info))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="dattn", standalone_mode=False)
    except Exception as exc:
        # Typer may vendor its own click, so click's exceptions are recognised by shape, not class.
        if type(exc).__name__ == "Abort":
            print("dattn: interrupted", file=sys.stderr)
            sys.exit(130)
        usage = hasattr(exc, "format_message") and hasattr(exc, "exit_code")
        if debug or not (usage or isinstance(exc, ValueError)):
            raise
        # ValueError: bad configuration or input, raised by the library with the fix in its text.
        message = exc.format_message() if usage else str(exc) or type(exc).__name__
        print(f"dattn: error: {message.splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("dattn: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
