"""The `dattn` Typer app with every command registered. Imported by main() once its signal handlers are in
place (cli/__init__.py stays light, so Ctrl-C while Python loads typer, rich and the commands is handled)."""

from __future__ import annotations

from . import bench, compare, env, impls, plan, profile, profiles, verify
from .app import app

app.command("verify")(verify.verify)
app.command("bench")(bench.bench)
app.command("profile")(profile.profile)
app.command("plan")(plan.plan)
app.command("compare")(compare.compare)
app.add_typer(profiles.profiles_app, name="profiles")
app.command("impls")(impls.impls)
app.command("env")(env.env)

__all__ = ["app"]
