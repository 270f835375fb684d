"""How an option becomes a Typer parameter: its type, default, help panel and the callback that refuses a bad value
in one sentence naming the option (cli/options.py declares the options, cli/build.py gives each command its own)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..workload.option import FIELD, Cli, literal_values
from ..workload.parse import check_number


def one_of(option: str, choices: tuple[str, ...]) -> Callable[[str | None], str | None]:
    """A callback refusing values outside `choices` with one sentence naming the option and the fix."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"{option} {value!r}: use {', '.join(choices[:-1])} or {choices[-1]}")
        return value

    return check


def finite(option: str, low: float, high: float, low_open: bool = False) -> Callable[[float | None], float | None]:
    """A callback refusing NaN, infinities and values outside [low, high] ((low, high] with `low_open`), naming
    the option and the range (click's own ranges let NaN through)."""

    def check(value: float | None) -> float | None:
        return value if value is None else check_number(option, value, low, high, low_open=low_open)

    return check


def typed(key: str, cli: Cli, annotation: Any = None, default: Any = None) -> tuple[Any, Any]:
    """(Annotated[type, typer.Option], default) of option `key` as one command takes it (`cli`: its form there);
    `annotation` and `default`: its model field's, where it is one."""
    if cli.default is not FIELD:
        default = cli.default
    elif isinstance(default, list) and cli.parse is not None:  # a comma-separated list's default, as typed
        default = ",".join(map(str, default))
    choices = (literal_values(annotation) if cli.choices is True else cli.choices) or ()
    base = str if choices else cli.type or annotation
    kind = list[base] | None if cli.many else base | None if default is None else base
    option = typer.Option(
        *(cli.names or ("--" + key.replace("_", "-"),)),
        help=cli.help,
        metavar=cli.metavar or ("|".join(choices) if choices else None),
        callback=one_of(cli.option(key), choices) if choices else cli.check,
        show_default=cli.show_default,
        rich_help_panel=cli.panel,
    )
    return Annotated[kind, option], default


# the keyword sets the option tables share (cli/options.py, cli/model_options.py)
FLAG, PATH, FILE = (
    dict(type=bool, default=False),
    dict(type=Path, default=None),
    dict(type=str, metavar="FILE", default=None),
)
UNSET = dict(default=None, show_default=False)  # its help says what not giving it means
UNSET_INT = dict(type=int, **UNSET)
TEXT = dict(type=str, default=None)
PCT = dict(type=float, metavar="PCT")  # a percentage
