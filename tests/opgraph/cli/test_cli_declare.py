"""Subcommands are declared once, with ``@command("name")``, and the app adds every declared one."""

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.cli.common import add_commands, command
from opgraph.ir import RegistryError


def test_every_declared_command_is_on_the_app() -> None:
    names = {c.name for c in app.registered_commands}
    assert {"capture", "simulate", "replay", "import", "serve-sim", "info"} <= names


def test_a_name_declared_twice_raises() -> None:
    with pytest.raises(RegistryError, match="'simulate' is already registered"):
        command("simulate")(lambda: None)


def test_a_declared_command_reports_errors_as_one_line() -> None:
    from opgraph.ir import OpgraphError

    @command("test-declared-fails")
    def fails() -> None:
        raise OpgraphError("broken on purpose", where="--here", hint="do otherwise")

    local = typer.Typer()
    add_commands(local, __name__)
    res = CliRunner().invoke(local, [])
    assert res.exit_code == 2
    assert "broken on purpose" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("command_name", ["replay", "profile"])
def test_both_measuring_commands_refuse_an_unknown_kind_the_same_way(command_name: str, tmp_path: Path) -> None:
    args = [command_name, "--kinds", "gemm,nope", "-o", str(tmp_path / "out.json")]
    if command_name == "replay":
        args.insert(1, str(tmp_path / "graph.json"))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "--kinds: unknown op kind 'nope'" in res.output and "gemm, memory" in res.output
