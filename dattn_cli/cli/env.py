"""`dattn env`: torch, devices (via NVML), attention backends found here."""

from __future__ import annotations

import json

from .options import JsonFlagOption
from .render.common import stdout
from .render.env import env_table


def env(json_: JsonFlagOption = False) -> None:
    """torch, devices (via NVML), attention backends found here."""
    from ..runtime.envinfo import collect_environment

    info = collect_environment()
    if json_:
        print(json.dumps(info.model_dump(), indent=1))
    else:
        stdout.print(env_table(info))
