"""`dattn env`: torch, devices (via NVML), attention backends found here."""

from __future__ import annotations

from .options import CsvOption, JsonOption
from .render.common import emit_files, machine_output, stdout
from .render.env import env_table


def env(json_out: JsonOption = None, csv_out: CsvOption = None) -> None:
    """torch, devices (via NVML), attention backends found here."""
    from ..runtime.envinfo import collect_environment

    machine_output(json_out, csv_out)
    info = collect_environment()
    stdout.print(env_table(info))
    emit_files(json_out, csv_out, info.model_dump(), [info.model_dump()])
