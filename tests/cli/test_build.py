"""cli/build.py: the commands' options are made from the Problem's fields, so a field reaches every command it
names with one edit (its `Cli`), and its value reaches the Problem each command builds."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from dattn_cli.cli.build import generated, model_values, options_of, parameters
from dattn_cli.workload.option import ALL, COMMANDS, SHAPE, Cli, cli_fields
from dattn_cli.workload.problem import Problem


def _click_options(command: str) -> set[str]:
    from dattn_cli.cli.commands import app

    click_command = typer.main.get_command(app).commands[command]
    return {name for param in click_command.params for name in param.opts + param.secondary_opts}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_problem_option_is_in_each_command_it_names_and_no_other(command):
    registered = _click_options(command)
    for key, (cli, _, _) in cli_fields(Problem).items():
        form = cli.form(command)
        if form is None:
            assert cli.option(key) not in registered, f"{command} takes {cli.option(key)}, which its Cli leaves out"
            continue
        for name in form.names or (form.option(key),):
            assert name.split("/")[0] in registered, f"{command} lacks {name} of Problem.{key}"


def test_a_field_without_cli_metadata_is_no_option():
    assert "mlp_ratio" not in cli_fields(Problem)
    assert all("--mlp-ratio" not in _click_options(command) for command in COMMANDS)


def test_world_size_is_declared_once_and_each_command_reads_it_its_way():
    """One field, three forms: bench takes ranks, verify a list of group sizes, plan also calls it --devices."""
    forms = {command: options_of(command)["world_size"][1] for command in ("verify", "bench", "plan")}
    assert forms["bench"].type is None and forms["verify"].parse("1,2,4", "--world-size") == [1, 2, 4]
    assert forms["plan"].names == ("--world-size", "--devices")
    assert "world_size" not in options_of("profile")


class Softcapped(Problem):
    """A Problem with one new field: its Cli is the only edit."""

    softcap: Annotated[float | None, Cli("Logit soft cap (tanh).", SHAPE, ALL)] = None


@pytest.mark.parametrize("command", COMMANDS)
def test_a_new_field_reaches_every_command_with_one_edit(command):
    assert "softcap" in [p.name for p in parameters(command, Softcapped)]
    app = typer.Typer()
    seen: dict[str, Any] = {}

    @app.command()
    @generated(command, Softcapped)
    def run(**given: Any) -> None:
        seen.update(model_values(command, given, Softcapped))

    result = CliRunner().invoke(app, ["--softcap", "30", "--heads", "4"])
    assert result.exit_code == 0, result.output
    assert seen["softcap"] == 30.0 and seen["heads"] == 4
    assert Softcapped(softcap=seen["softcap"]).softcap == 30.0
    help_text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--softcap" in help_text and "Logit soft cap (tanh)." in help_text


def test_values_are_parsed_naming_the_option():
    values = model_values("plan", {"seq_len": "64k", "segment_lengths": "1024,2048", "heads": None}, Problem)
    assert values == {"seq_len": 65536, "segment_lengths": [1024, 2048]}  # heads unset: the model's default
    with pytest.raises(ValueError, match="--segments"):
        model_values("plan", {"segment_lengths": "1k,x"}, Problem)
    assert model_values("bench", {"seq_lens": "2k,4k", "densities": "0.1,0.5"}, _sweep())["seq_lens"] == [2048, 4096]


def _sweep():
    from dattn_cli.bench import Sweep

    return Sweep


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_each_command_its_own_defaults(command):
    defaults = {p.name: p.default for p in parameters(command)}
    expected = {"verify": None, "bench": None, "profile": "8k", "plan": "64k"}
    assert defaults["seq_lens" if command == "bench" else "seq_len"] == expected[command]
    if command != "verify":  # verify: an unset shape option means the case matrix
        assert defaults["segment_lengths"] == "2048,4096,8192"
        # plan: unset means the Problem's 8 (its help says so), and a given one conflicts with --model
        assert defaults["heads"] == (None if command == "plan" else 8)


def test_help_lists_order_first_then_the_rest_as_declared():
    """ORDER names only the options --help shows out of declaration order; the rest keep it."""
    plan = [p.name for p in parameters("plan")]
    in_plan_panel = ["profile", "max_memory", "backend", "max_seq", "min_devices", "check", "calibrate"]
    assert [name for name in plan if name in in_plan_panel + ["fail_if_infeasible"]] == [
        *in_plan_panel,
        "fail_if_infeasible",
    ]
    bench = [p.name for p in parameters("bench")]
    assert bench.index("seed") < bench.index("compiled") < bench.index("max_memory") < bench.index("baseline")
    assert bench[-2:] == ["markdown", "quiet"]  # the output panel, as OPTIONS declares it
    assert [p.name for p in parameters("verify")][:3] == ["impl", "backend", "device"]
