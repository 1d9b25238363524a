"""``opgraph run``: the shipped default scenario end to end, exit codes 0 / 1 / 2, ``--json``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import cli_runner, one_error_line

from opgraph.cli.app import app

REPO = Path(__file__).resolve().parents[3]
DEFAULT = REPO / "examples" / "scenarios" / "default.scenario.toml"
DATA = REPO / "tests" / "data" / "h100"
GRAPH = "llama-3.2-1b-l2-prefill256.graph.json.gz"


def graph_scenario(tmp_path: Path, expect: str) -> Path:
    shutil.copy(DATA / GRAPH, tmp_path / GRAPH)
    path = tmp_path / "g.scenario.toml"
    # The roofline, named: these tests are about how expectations pass and fail, not about which cost
    # model is the default (the device's profile, whose host issue times make this graph host-bound).
    path.write_text(
        f'[hardware]\ncost_model = "roofline"\n[simulation]\nengines = "1..2"\n[[phases]]\ngraph = "{GRAPH}"\n'
        f"[expect]\n{expect}\n"
    )
    return path


def test_default_scenario_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    res = cli_runner().invoke(app, ["run", str(DEFAULT), "-o", str(out)])
    assert res.exit_code == 0, res.output + (res.stderr if res.stderr_bytes else "")
    assert "PASSED" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True
    assert [p["name"] for p in summary["phases"]] == ["prefill", "decode"]
    for phase in summary["phases"]:
        assert [r["engines"] for r in phase["sweep"]] == [1, 2, 3]
        assert phase["coverage"]["missing"] == []
        assert phase["model"] == "llama-3.1-8b"
    checks = {e["id"] for e in summary["expectations"]}
    assert {"prefill/operators", "prefill/makespan_us", "decode/makespan_us", "decode/speedup"} <= checks
    for name in ("report.html", "trace.perfetto.json.gz", "prefill.graph.json.gz", "decode.3eng.timeline.json.gz"):
        assert (out / name).is_file(), name


def test_failed_expectation_exits_1_with_a_list(tmp_path: Path) -> None:
    path = graph_scenario(
        tmp_path, 'operators = ["linear", "softmax"]\nmakespan_us = { max = 10 }\nspeedup = { min = 0.5 }'
    )
    res = cli_runner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--no-report"])
    assert res.exit_code == 1
    assert "2 of 3 expectation(s) failed:" in res.stderr
    assert "  - llama-3.2-1b-l2-prefill256 operators: missing required operators: softmax" in res.stderr
    assert "  - llama-3.2-1b-l2-prefill256 makespan_us: makespan" in res.stderr
    assert "FAILED" in res.stdout
    assert not (tmp_path / "out" / "report.html").exists()


def test_json_output(tmp_path: Path) -> None:
    path = graph_scenario(tmp_path, "speedup = { min = 0.5 }")
    res = cli_runner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--json"])
    assert res.exit_code == 0, res.stderr
    payload = json.loads(res.stdout)
    assert payload["passed"] is True and payload["expectations"][0]["id"].endswith("/speedup")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[phases]\n", "not valid TOML"),
        ('[model]\nsource = "x"\ndtyp = "bf16"\n[[phases]]\n', "model.dtyp: unknown field (did you mean 'dtype'?)"),
        ('[hardware]\nname = "h900"\n[[phases]]\ngraph = "g.json"\n', "hardware.name:"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.scenario.toml"
    path.write_text(text)
    res = cli_runner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}") and message in lines[0]


def test_help_lists_exit_codes() -> None:
    res = cli_runner().invoke(app, ["run", "--help"])
    assert res.exit_code == 0
    assert "SCENARIO" in res.stdout and "--output" in res.stdout and "exit" in res.stdout.lower()


def test_a_host_time_without_a_host_is_one_line_exit_2(tmp_path: Path) -> None:
    path = graph_scenario(tmp_path, "")
    path.write_text(path.read_text().replace("[simulation]\n", "[simulation]\nhost = 'none'\nhost_us = 3.5\n"))
    res = cli_runner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--no-report"])
    line = one_error_line(res)
    assert f"{path}: simulation.host_us: 3.5 us per op has no host to spend it" in line
    assert "remove host_us" in line and not (tmp_path / "out").exists()
