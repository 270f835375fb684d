"""`dattn --config opts.yaml`: per-command option defaults from a YAML file (the command line wins).

The file is read by workload/yaml_input.py (no anchors or aliases, bounded size). A value is what the
command line would take: a list is a comma-separated value (segments: [2048, 4096]) or, for a repeatable
option, its repeats (impl: [sdpa, math]); true/false only for flags.
"""

from __future__ import annotations

from pathlib import Path

import typer


def load_config(path: Path) -> dict:
    from ..workload.parse import clip  # here, not above: the workload package imports torch
    from ..workload.yaml_input import read_yaml

    data = read_yaml(path, f"--config {clip(path)}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"--config {path}: expected a mapping of command names to options, e.g. 'verify: {{dtype: float32}}'"
        )
    return data


def config_default_map(ctx: typer.Context, data: dict, path: Path) -> dict:
    """click's default_map for `data`: {command: {parameter name: value}}, every name checked."""
    from ..workload.parse import clip, shown

    commands = getattr(ctx.command, "commands", {})
    path = clip(path)
    default_map = {}
    for command, options in data.items():
        sub = commands.get(command) if isinstance(command, str) else None
        if sub is None:
            raise ValueError(f"--config {path}: unknown command {shown(command)}; use one of {', '.join(commands)}")
        if not isinstance(options, dict):
            raise ValueError(f"--config {path}: '{command}' must map option names to values")
        params = _by_name(command, sub.params)
        entry = {}
        for key, value in options.items():
            param = params.get(str(key).lstrip("-").replace("-", "_"))
            if param is None:
                raise ValueError(
                    f"--config {path}: '{command}' has no option {shown(key)}; see 'dattn {command} --help'"
                )
            entry[param.name] = _value(param, value, f"--config {path}: '{command}' option {key}")
        default_map[command] = entry
    return default_map


def _by_name(command: str, params: list) -> dict:
    """A command's parameters by parameter name, by option name (seq_len for --seq-len) and by a deprecated
    option name (plan's memory for --max-memory)."""
    from .deprecated import DEPRECATED

    found = {p.name: p for p in params}
    found.update({opt[2:].replace("-", "_"): p for p in params for opt in getattr(p, "opts", ()) if opt[:2] == "--"})
    for old, new in DEPRECATED.get(command, {}).items():
        if (param := found.get(new[2:].replace("-", "_"))) is not None:
            found.setdefault(old[2:].replace("-", "_"), param)
    return found


def _value(param, value: object, where: str) -> object:
    """`value` as the command line would give it: lists joined with commas (unless the option repeats),
    booleans only for flags, no nested mappings."""
    flag = getattr(param, "is_flag", False) or getattr(param, "is_bool_flag", False)
    if isinstance(value, bool) and not flag:
        raise ValueError(f"{where}: {value} is not a value for it; write the value as on the command line")
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
        raise ValueError(f"{where}: a nested value; write it as on the command line, e.g. 2048,4096")
    if getattr(param, "multiple", False):
        return value if isinstance(value, list) else [value]  # impl: sdpa is one repeat
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value
