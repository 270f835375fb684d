"""The `dattn` Typer application and its root options; the commands are registered in cli/__init__.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__
from .config import config_default_map, load_config
from .render.common import stdout

app = typer.Typer(
    name="dattn",
    help="Verify, benchmark, profile and capacity-plan long-context dilated attention.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        stdout.print(f"dattn {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[Optional[Path], typer.Option("--config", help="YAML file of options per command (the CLI wins).")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    if config is not None:
        ctx.default_map = config_default_map(ctx, load_config(config), config)
