"""``--help`` off a terminal names every option whole (issue 16: nothing is cut when output is a pipe)."""

from __future__ import annotations

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from opgraph.cli.app import app


def _commands() -> list[str]:
    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("columns", ["40", "80"])
@pytest.mark.parametrize("command", _commands())
def test_every_option_name_is_whole_in_help(command: str, columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)  # as a fresh process without TERMINAL_WIDTH
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", None)
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": columns, "TERMINAL_WIDTH": None})
    assert res.exit_code == 0, res.output
    names = [o for p in cmd.params for o in p.opts if o.startswith("--")]
    missing = [n for n in names if n not in res.output]
    assert not missing, f"cut from `{command} --help` at COLUMNS={columns}: {missing}"
    assert "…" not in res.output
