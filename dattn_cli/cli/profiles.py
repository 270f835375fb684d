"""`dattn profiles list|show|validate`: the hardware profiles the planner reads."""

from __future__ import annotations

from typing import Annotated

import typer

from .render.common import stdout
from .render.env import profiles_table

profiles_app = typer.Typer(
    help="Hardware profiles: list, show, validate (shipped ones or your own YAML).", invoke_without_command=True
)


@profiles_app.callback()
def profiles_group(ctx: typer.Context) -> None:
    """Hardware profiles: list, show, validate (shipped ones or your own YAML)."""
    if ctx.invoked_subcommand is None:  # plain `dattn profiles`: the help, exit 0 (as plain `dattn`)
        typer.echo(ctx.get_help())
        raise typer.Exit()


@profiles_app.command("list")
def profiles_list() -> None:
    """The shipped profiles: name, device, memory, bf16 / fp32 dense peak, devices per node."""
    from ..plan.profiles import load_profile, shipped_profiles

    stdout.print(profiles_table({name: load_profile(name) for name in shipped_profiles()}))


@profiles_app.command("show")
def profiles_show(
    profile: Annotated[str, typer.Argument(help="A shipped profile name or a path to a YAML file.")],
) -> None:
    """Print one profile as YAML, sources included."""
    from ..plan.profiles import dump_profile, load_profile

    print(dump_profile(load_profile(profile)), end="")


@profiles_app.command("validate")
def profiles_validate(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Profile names or YAML paths (default: every shipped one).")
    ] = None,
) -> None:
    """Check profiles against the schema; the first problem is reported as one line, exit 2."""
    from ..plan.profiles import load_profile, shipped_profiles

    for name in paths or list(shipped_profiles()):
        profile = load_profile(name)
        stdout.print(f"ok: {name} ({profile.name})", markup=False, highlight=False)
