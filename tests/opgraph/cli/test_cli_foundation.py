"""The CLI skeleton: info, schema (with its golden copy), --help golden files, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, check_golden
from help_outline import assert_help_mentions, help_names, help_outline
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import Edge, Gemm, GraphMetadata, Norm, OpGraph, Stage, save_graph

ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env=ENV)


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    g = OpGraph(
        metadata=GraphMetadata(model="tiny", phase="prefill", capture={"batch": 1, "seq_len": 8}),
        ops=(
            Norm(id=0, rows=8, hidden=64, layer=0, stage=Stage.PREFILL),
            Gemm(id=1, m=8, n=64, k=64, layer=0, stage=Stage.PREFILL),
        ),
        edges=(Edge(src=0, dst=1),),
    )
    return save_graph(g, tmp_path / "g.json.gz")


def test_info_table_and_json(runner: CliRunner, graph_file: Path) -> None:
    res = runner.invoke(app, ["info", str(graph_file)])
    assert res.exit_code == 0, res.output
    assert "tiny" in res.output and "gemm" in res.output and "norm" in res.output
    assert "layers: 1" in res.output
    res = runner.invoke(app, ["info", str(graph_file), "--json"])
    data = json.loads(res.output)
    assert data["ops"] == 2 and data["by_kind"]["gemm"]["flops"] == 2 * 8 * 64 * 64


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{", "not valid JSON"),
        (b'{"schema_version": 1, "ops": [{"kind": "gemm", "id": 0, "m": -1, "n": 1, "k": 1}]}', "ops.0.gemm.m"),
        (b'{"schema_version": 1, "ops": [], "edges": [{"src": 0, "dst": 1}]}', "edges.0.src"),
        (b'{"schema_version": 4}', "newer"),
    ],
)
def test_info_bad_input_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    res = CliRunner(env=ENV).invoke(app, ["info", str(p)])
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and message in err and str(p) in err
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate"], "opgraph simulate: Missing argument 'GRAPH' (see 'opgraph simulate -h')"),
        (["simulate", "g.json", "--no-such-flag"], "opgraph simulate: No such option: --no-such-flag"),
        (["simulate", "g.json", "--tp", "abc"], "opgraph simulate: Invalid value for '--tp'"),
        (["export", "t.json", "-f", "pdf"], "'pdf' is not one of"),
        (["hardware", "show"], "opgraph hardware show: Missing argument"),
        (["no-such-command"], "opgraph: No such command 'no-such-command' (see 'opgraph -h')"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], message: str) -> None:
    res = CliRunner(env=ENV).invoke(app, args, prog_name="opgraph")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in res.output and "╭" not in res.output


def test_no_arguments_still_prints_the_help() -> None:
    res = CliRunner(env=ENV).invoke(app, [], prog_name="opgraph")
    assert res.exit_code == 2
    assert "Commands" in res.stdout and not res.stderr.strip()


def test_schema_golden(runner: CliRunner) -> None:
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0
    schemas = json.loads(res.output)
    assert {"graph", "timeline"} <= set(schemas)
    check_golden("ir/schema.json", schemas)
    one = json.loads(runner.invoke(app, ["schema", "graph"]).output)
    assert one == schemas["graph"]
    bad = runner.invoke(app, ["schema", "nope"])
    assert bad.exit_code == 2 and "unknown type" in bad.stderr


def test_help_golden(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden holds what users rely on (commands, options, help texts), not typer's drawing of it."""
    import typer.rich_utils

    check_golden("ir/help_outline.txt", help_outline(app))
    # The real screen still renders and names every command and option. Typer reads TERMINAL_WIDTH and
    # FORCE_COLOR once, when it first renders help in the process (another test's env may be in force then).
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 100)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", None)
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    assert all(c.name for c in app.registered_commands) and all(g.name for g in app.registered_groups)
    assert {"capture", "simulate", "hardware", "ops", "--version", "-h"} <= set(help_names(app))
    assert_help_mentions(res.output, help_names(app))


def test_import_opgraph_does_not_import_torch() -> None:
    code = (
        "import sys, opgraph, opgraph.ir, hardware, simulators, validators;"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("name", ["opgraph", "hardware", "simulators", "validators"])
def test_packages_resolve_to_this_repo(name: str) -> None:
    """PyPI has packages named validators, hardware and simulators: ours must win."""
    import importlib

    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == REPO / name
