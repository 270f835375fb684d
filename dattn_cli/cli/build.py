"""The commands' options, made from the models: one function gives a command its parameters, one turns what
was given back into model fields.

A command is written `@generated("bench") def bench(**given)`: its signature (what Typer reads) is built
from every Problem field whose `Cli` names the command (workload/problem.py) and every option of
cli/options.py that does, each in the form that command takes. `model_values(command, given, Sweep)`
then parses the given text ("8k", "2048,4096": errors name the option) into the fields of a model.
So a new Problem field with a `Cli` reaches every command it names, and their Problems, with that one edit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..workload.option import PANELS, Cli, cli_fields
from ..workload.problem import Problem
from .options import OPTIONS, ORDER, typed


def options_of(command: str, model: type = Problem) -> dict[str, tuple[str, Cli, Any, Any]]:
    """{parameter: (option key, its form in `command`, field annotation, field default)}: `model`'s fields
    (the Problem's by default) first, then the options of cli/options.py."""
    found = {}
    for key, (cli, annotation, default) in cli_fields(model).items():
        if (form := cli.form(command)) is not None:
            found[form.dest or key] = (key, form, annotation, default)
    for key, cli in OPTIONS.items():
        if (form := cli.form(command)) is not None:
            found[key] = (key, form, None, None)
    return found


def _place(key: str, form: Cli) -> tuple[int, int]:
    """Where --help shows an option: its panel, then ORDER within it (options ORDER leaves out come last, as
    declared: sorted() keeps their order)."""
    order = ORDER.get(form.panel, ())
    return PANELS.index(form.panel), order.index(key) if key in order else len(order)


def parameters(command: str, model: type = Problem) -> list[inspect.Parameter]:
    """`command`'s parameters, as Typer reads them from a signature, in --help's order."""
    options = options_of(command, model)
    listed = sorted(options.items(), key=lambda item: _place(item[1][0], item[1][1]))
    made = []
    for name, (key, form, annotation, default) in listed:
        kind, value = typed(key, form, annotation, default)
        made.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=value))
    return made


def generated(command: str, model: type = Problem) -> Callable[[Callable], Callable]:
    """A decorator giving `def command(**given)` the parameters of `command` (Typer calls it with each by name)."""

    def attach(func: Callable) -> Callable:
        func.__signature__ = inspect.Signature(parameters(command, model))
        return func

    return attach


def model_values(command: str, given: dict[str, Any], model: type) -> dict[str, Any]:
    """The options of `command` given for fields of `model`, their text parsed; one left unset (None) is left
    out, so the field keeps the model's default."""
    options = options_of(command, model)
    return {
        name: _parsed(options[name], value)
        for name, value in given.items()
        if name in model.model_fields and value is not None
    }


def parse_option(command: str, name: str, value: Any, model: type = Problem) -> Any:
    """The value of parameter `name` of `command` from its text (unchanged where the option has no parser)."""
    return _parsed(options_of(command, model)[name], value)


def _parsed(option: tuple[str, Cli, Any, Any], value: Any) -> Any:
    key, form, _, _ = option
    return form.parse(value, form.option(key)) if form.parse and value is not None else value
