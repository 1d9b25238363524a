"""``opgraph simulate`` on a planned generation: windows, not every op built (issue 20 item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import load_graph, load_timeline


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import TINY_LLAMA

    root = tmp_path_factory.mktemp("gen")
    (root / "config.json").write_text(json.dumps(TINY_LLAMA))
    out = root / "g.json.gz"
    args = ["capture", str(root / "config.json"), "--phase", "generate", "--seq-len", "16", "--new-tokens", "10"]
    res = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert load_graph(out).generation is not None
    return out


def test_a_planned_generation_simulates_by_windows_and_equals_the_full_graph(planned: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["-H", "h100", "-c", "roofline", "--policy", "stream", "--json"]
    res = runner.invoke(app, ["simulate", str(planned), *args, "-o", str(tmp_path / "t.json.gz")])
    assert res.exit_code == 0, res.output
    windows = json.loads(res.output)["generation"]
    assert windows["planned_steps"] == 8
    # the same graph with every op built: a sweep goes op by op through run_study
    full = runner.invoke(app, ["simulate", str(planned), *args, "-e", "1..2"])
    assert full.exit_code == 0, full.output
    makespan = next(p["makespan_us"] for p in json.loads(full.output)["sweep"]["points"] if p["engines"] == 1)
    assert windows["makespan_us"] == pytest.approx(makespan, rel=1e-3)
    timeline = load_timeline(tmp_path / "t.json.gz")
    assert {s.op_id for s in timeline.spans if s.op_id is not None} >= {op.id for op in load_graph(planned).ops}
