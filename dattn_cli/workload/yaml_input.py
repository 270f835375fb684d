"""The user's YAML files (hardware profiles, --config option files), read safely.

yaml.safe_load evaluates nothing, but it still expands aliases: a 2 KB file of nested `&a [*b, *b, ...]`
anchors becomes gigabytes of lists (a "billion laughs"), and an error message repeating the input becomes
as large. Nothing dattn reads needs an alias, so anchors and aliases are refused outright, before any is
expanded; files are bounded in size and nesting too. Every problem is one ValueError line naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError

from .parse import clip

MAX_YAML_BYTES = 1 << 20  # 1 MiB: a profile or an option file is a few KB
MAX_DEPTH = 32  # profiles nest 2 levels deep, option files 2


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors (&name) and aliases (*name) where they appear, and deep nesting."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ComposerError(
                None,
                None,
                "anchors (&name) and aliases (*name) are not allowed: write each value out",
                event.start_mark,
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, source: str) -> Any:
    """The data of one YAML document; ValueError "SOURCE: not valid YAML at line L: why" otherwise."""
    if len(text) > MAX_YAML_BYTES:
        raise ValueError(
            f"{source}: {len(text):,} characters, more than a YAML file here may hold "
            f"({MAX_YAML_BYTES:,}); is it the right file?"
        )
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        why = getattr(exc, "problem", None) or type(exc).__name__
        raise ValueError(f"{source}: not valid YAML{where}: {clip(why)}") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid YAML: nested too deeply") from None
    except ValueError as exc:  # a value the constructor cannot take, e.g. an integer of more than 4,300 digits
        raise ValueError(f"{source}: not valid YAML: {clip(exc)}") from None


def read_yaml(path: Path, source: str) -> Any:
    """The data of the YAML file at `path` (at most MAX_YAML_BYTES, UTF-8); ValueError naming `source` otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)  # a device or a FIFO is not read forever
    except OSError as exc:
        raise ValueError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ValueError(
            f"{source}: larger than {MAX_YAML_BYTES:,} bytes, more than a YAML file here may hold; "
            "is it the right file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source}: not UTF-8 text (byte {exc.start}); is it a YAML file?") from None
    return load_yaml(text, source)
