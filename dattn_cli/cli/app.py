"""The `dattn` Typer application and its root options; the commands are registered in cli/commands.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import __version__
from .config import config_default_map, load_config
from .render.common import stdout

app = typer.Typer(
    name="dattn",
    help="Verify, benchmark, profile and capacity-plan long-context dilated attention.",
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
)


def git_commit() -> str | None:
    """The commit of a source checkout dattn runs from; None for an installed wheel or without git."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _version(value: bool) -> None:
    if value:
        import torch

        commit = git_commit()
        stdout.print(f"dattn {__version__}" + (f" (git {commit})" if commit else "") + f", torch {torch.__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML file of options per command (the CLI wins).")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    if ctx.invoked_subcommand is None:  # plain `dattn`: the help, exit 0
        typer.echo(ctx.get_help())
        raise typer.Exit()
    if config is not None:
        ctx.default_map = config_default_map(ctx, load_config(config), config)
