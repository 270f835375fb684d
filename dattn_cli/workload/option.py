"""How the command line shows a model field: plain data kept beside the field, read by cli/build.py.

A Problem field declares its option with its type: `heads: Annotated[int, Cli("Attention heads.", SHAPE, ALL)]`.
cli/build.py turns every field with a `Cli` into a parameter of each command it names (the field's
default is the option's) and its value back into the field, so a new Problem field reaches every command
with that one edit. Where a command reads the option its own way (verify takes several --world-size
values, plan calls it --devices too), `forms` holds that command's differences. No typer here: the
library does not depend on the command line (torch is not imported either: `dattn --help` stays fast).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# help panels, in the order --help shows them
IMPL, SHAPE, PATTERN, BLOCK, LAYER = "Implementation", "Shape", "Pattern", "Block-sparse", "Layer/model"
MEASURE, DIST, PLAN, OUTPUT = "Measurement", "Distributed", "Plan", "Output"
PANELS = (IMPL, SHAPE, PATTERN, BLOCK, LAYER, MEASURE, DIST, PLAN, OUTPUT)
# the commands, and the groups of them a field names
COMMANDS = ("verify", "bench", "profile", "plan")
ALL = COMMANDS
MEASURED = ("verify", "bench", "profile")  # run on this machine (plan predicts)
BLOCK_SPARSE = ("bench", "profile")  # take one block pattern's options
LAYERS = ("bench", "plan")  # take --target layer/model

FIELD = object()  # Cli.default: the model field's own default


@dataclass(frozen=True)
class Cli:
    """One option: its help and panel, the commands that take it, and how its text becomes the value.

    names: the option's names (default: --field-name; "--causal/--no-causal" for a flag pair).
    type: what the command line reads where it is not the field's type (str for "8k" or "2048,4096").
    parse: (text, option name) -> value; its ValueError names the option.
    choices: values refused in one sentence naming the option and the fix (True: the field's Literal).
    many: repeatable, a list of values.
    dest: the parameter's name and the model field its value goes to (default: this field), e.g. bench's
        --seq-len fills Sweep.seq_lens.
    check: (value) -> value, run as the option is read (e.g. --device cuda where there is none).
    forms: per command, the attributes that differ there.
    """

    help: str
    panel: str
    commands: tuple[str, ...]
    names: tuple[str, ...] = ()
    type: Any = None
    parse: Callable[[Any, str], Any] | None = None
    choices: tuple[str, ...] | bool = ()
    metavar: str | None = None
    default: Any = FIELD
    show_default: bool = True
    many: bool = False
    dest: str | None = None
    check: Callable[[Any], Any] | None = None
    forms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def form(self, command: str) -> Cli | None:
        """This option as `command` takes it; None when it does not."""
        if command not in self.commands:
            return None
        return dataclasses.replace(self, **self.forms.get(command, {}), forms={})

    def option(self, name: str) -> str:
        """The option's first name, as messages name it: --seq-len for seq_len."""
        return self.names[0].split("/")[0] if self.names else "--" + name.replace("_", "-")


def cli_fields(model: type) -> dict[str, tuple[Cli, Any, Any]]:
    """{field: (its Cli, its annotation, its default)} of the fields of a pydantic `model` that have one."""
    found = {}
    for name, info in model.model_fields.items():
        cli = next((m for m in info.metadata if isinstance(m, Cli)), None)
        if cli is not None:
            found[name] = (cli, info.annotation, info.get_default(call_default_factory=True))
    return found


def literal_values(annotation: Any) -> tuple[str, ...]:
    """The values of a Literal annotation (inside `X | None` too)."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return tuple(v for arg in typing.get_args(annotation) for v in literal_values(arg))
