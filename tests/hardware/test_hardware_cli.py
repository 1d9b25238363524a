"""``opgraph hardware list`` and ``opgraph hardware show``, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.cli.common import console
from tests.conftest import check_golden
from tests.help_outline import assert_help_mentions, help_names, help_outline

runner = CliRunner()


@pytest.fixture(autouse=True)
def _width_80(monkeypatch: pytest.MonkeyPatch) -> None:
    """Golden output must not depend on the terminal (or $COLUMNS) the tests run in."""
    monkeypatch.setattr(console, "_width", 80)


def test_list_golden() -> None:
    result = runner.invoke(app, ["hardware", "list"])
    assert result.exit_code == 0, result.output
    check_golden("hardware/list.txt", result.stdout)


def test_list_json_has_every_device() -> None:
    result = runner.invoke(app, ["hardware", "list", "--json"])
    assert result.exit_code == 0
    names = {d["name"] for d in json.loads(result.stdout)}
    assert {"h100-sxm", "mi300x", "xeon-8480"} <= names


def test_show_golden_and_alias() -> None:
    result = runner.invoke(app, ["hardware", "show", "H100"])
    assert result.exit_code == 0, result.output
    check_golden("hardware/show_h100.txt", result.stdout)
    assert "3.35 TB/s" in result.stdout and "source:" in result.stdout


def test_show_json_round_trips() -> None:
    from hardware import HardwareSpec, load_hardware

    result = runner.invoke(app, ["hardware", "show", "mi300x", "--json"])
    assert HardwareSpec.model_validate_json(result.stdout) == load_hardware("mi300x")


def test_show_a_user_file(tmp_path: Path) -> None:
    path = tmp_path / "h100_2x_bw.toml"
    path.write_text('base = "h100"\nmemory_bandwidth = "6.7 TB/s"\n')
    result = runner.invoke(app, ["hardware", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "h100_2x_bw" in result.stdout and "6.7 TB/s" in result.stdout


def test_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["hardware", "show", "h1000"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown hardware 'h1000'") and "h100-sxm" in lines[0]
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmemory_bytes = "1 GiB"\nmemory_bandwidth = -1\n')
    result = runner.invoke(app, ["hardware", "show", str(bad)])
    assert result.exit_code == 2 and f"error: {bad}: memory_bandwidth" in result.stderr


def test_help_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden holds what users rely on (argument, options, help texts), not typer's drawing of it."""
    import typer.rich_utils

    check_golden("hardware/show_help_outline.txt", help_outline(app, "hardware", "show"))
    # The real screen still renders and names the argument and every option. Typer reads TERMINAL_WIDTH
    # once per process, when it first renders help: pin the width rather than set it for later tests.
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 80)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", None)
    result = runner.invoke(app, ["hardware", "show", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert {"NAME|FILE", "--json", "-h", "--help"} <= set(help_names(app, "hardware", "show"))
    assert_help_mentions(result.stdout, ["opgraph hardware show", *help_names(app, "hardware", "show")])


GRAPH = Path("tests/data/h100/llama-3.2-1b-l2-prefill256.graph.json.gz")


@pytest.mark.parametrize(("model", "warned"), [("formula", True), ("roofline", False)])
def test_simulate_with_the_formula_model_says_it_ignores_the_hardware(model: str, warned: bool) -> None:
    """Issue 16: ``-c formula -H h100`` must not print hours for a prefill without saying why."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run(
        [sys.executable, "-m", "opgraph", "simulate", str(GRAPH), "-c", model, "-H", "h100"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The warning is one of the run's notes (printed with the summary), or Python's warning line.
    said = " ".join((done.stdout + done.stderr).split())
    assert ("formula cost model ignores h100-sxm's peak FLOP/s and memory bandwidth" in said) is warned, said
