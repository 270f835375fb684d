"""`dattn --config opts.yaml`: per-command option defaults from a YAML file (the command line wins)."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml


def load_config(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ValueError(f"--config {path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of command names to options, e.g. 'verify: {{dtype: float32}}'")
    return data


def config_default_map(ctx: typer.Context, data: dict, path: Path) -> dict:
    """click's default_map for `data`: {command: {parameter name: value}}, every name checked."""
    commands = getattr(ctx.command, "commands", {})
    default_map = {}
    for command, options in data.items():
        sub = commands.get(command)
        if sub is None:
            raise ValueError(f"--config {path}: unknown command {command!r}; use one of {', '.join(commands)}")
        if not isinstance(options, dict):
            raise ValueError(f"--config {path}: '{command}' must map option names to values")
        names = {p.name for p in sub.params}
        entry = {}
        for key, value in options.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise ValueError(f"--config {path}: '{command}' has no option {key!r}; see 'dattn {command} --help'")
            entry[name] = value
        default_map[command] = entry
    return default_map
