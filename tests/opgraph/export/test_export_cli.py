"""``opgraph export``: each format from saved timelines, format from the suffix, one-line errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.export.demo import demo_graph, demo_measured, demo_simulated
from opgraph.ir import save_graph, save_timeline

runner = CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    g = demo_graph(layers=1, tokens=256, hidden=512, heads=8, kv_heads=2)
    return {
        "graph": save_graph(g, tmp_path / "graph.json.gz"),
        "sim": save_timeline(demo_simulated(g), tmp_path / "sim.json"),
        "meas": save_timeline(demo_measured(g), tmp_path / "meas.json.gz"),
    }


def test_perfetto_with_graph_and_flows(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "trace.json.gz"
    args = ["export", str(files["sim"]), str(files["meas"]), "-o", str(out), "--graph", str(files["graph"]), "--flows"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "2 timelines" in res.output
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert any(e["ph"] == "s" for e in doc["traceEvents"])
    assert any("flops" in e["args"] for e in doc["traceEvents"] if e["ph"] == "X")


@pytest.mark.parametrize(("name", "magic"), [("g.png", b"\x89PNG"), ("r.html", b"<!DOCTYPE html>")])
def test_png_and_html_from_suffix(files: dict[str, Path], tmp_path: Path, name: str, magic: bytes) -> None:
    out = tmp_path / name
    res = runner.invoke(
        app, ["export", str(files["sim"]), str(files["meas"]), "-o", str(out), "-g", str(files["graph"])]
    )
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-o", "x.txt"], "cannot tell the format"),
        (["-o", "x.png", "--flows"], "--flows only applies"),
        (["-o", "x.json", "--flows"], "--flows needs the graph"),
        (["-o", "x.json", "--format", "png"], "must end in .png"),
    ],
)
def test_errors_are_one_line(files: dict[str, Path], tmp_path: Path, extra: list[str], message: str) -> None:
    extra = [str(tmp_path / e) if e.startswith("x.") else e for e in extra]
    res = runner.invoke(app, ["export", str(files["sim"]), *extra])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]


def test_missing_timeline_is_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["export", str(tmp_path / "nope.json"), "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 2 and "no such file" in res.stderr


def test_demo_writes_trace_png_and_report(tmp_path: Path) -> None:
    from opgraph.export.demo import main

    assert main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.html", "demo.png", "demo.trace.json.gz"]


def test_open_serves_the_trace_once(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import webbrowser

    from test_export_serve import TIMEOUT_S, FakeBrowser, _free_port

    browser = FakeBrowser()
    monkeypatch.setattr(webbrowser, "open", browser)
    port = _free_port()
    out = tmp_path / "t.json"
    res = runner.invoke(
        app, ["export", str(files["sim"]), "-o", str(out), "--open", "--port", str(port), "--timeout", "20"]
    )
    assert res.exit_code == 0, res.output
    assert browser.thread is not None
    browser.thread.join(TIMEOUT_S)
    assert browser.opened == [f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/t.json"]
    assert browser.responses[-1][0] == 200 and browser.responses[-1][2] == out.read_bytes()
    assert f"http://127.0.0.1:{port}" in res.stderr
