"""``opgraph.run_study``: the one simulation path of the CLI and of scenarios."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

import opgraph
from opgraph.cli.app import app
from opgraph.ir import Gemm, GraphMetadata, OpGraph, load_graph

DATA = REPO / "tests" / "data" / "h100"
GRAPH = "llama-3.2-1b-l2-prefill256.graph.json.gz"


def _hw_model() -> tuple[object, object]:
    from hardware import load_hardware, resolve_cost_model

    return load_hardware("h100"), resolve_cost_model("roofline")


def test_import_opgraph_loads_neither_torch_nor_the_simulators() -> None:
    code = "import sys, opgraph; opgraph.run_study; print('torch' in sys.modules, 'simulators' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_cli_and_scenario_simulate_the_same_way(tmp_path: Path) -> None:
    """Both go through run_study: the same graph and settings give the same sweep."""
    from opgraph.scenario import run_scenario

    shutil.copy(DATA / GRAPH, tmp_path / GRAPH)
    scenario = tmp_path / "s.scenario.toml"
    scenario.write_text(
        f'[simulation]\nengines = "1..3"\ntp = 2\n[hardware]\nname = "h100"\n[[phases]]\ngraph = "{GRAPH}"\n'
    )
    summary = run_scenario(scenario, tmp_path / "out", reports=False)
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / GRAPH), "-e", "1..3", "--tp", "2", "--json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.output)
    points = {p["engines"]: p["makespan_us"] for p in cli["sweep"]["points"]}
    assert points == {r.engines: r.makespan_us for r in summary.phases[0].sweep}
    assert cli["sweep"]["recommended"] == summary.phases[0].recommended_engines


def test_tp_shards_a_graph_without_collectives_and_says_so() -> None:
    hw, model = _hw_model()
    graph = load_graph(DATA / GRAPH)
    study = opgraph.run_study(graph, hw, model, opgraph.study_config(tp=2))  # type: ignore[arg-type]
    assert study.graph is not graph and study.graph.ops_of(opgraph.OpKind.COLLECTIVE)
    assert study.notes and "tp=2" in study.notes[0]
    replicated = opgraph.run_study(graph, hw, model, opgraph.study_config(tp=2), shard=False)  # type: ignore[arg-type]
    assert replicated.graph is graph and replicated.notes == ()


class _Declines:
    """A cost model that costs nothing."""

    def estimate(self, op: object, hw: object) -> object:
        from hardware import UncostedOpError

        raise UncostedOpError("not modelled")


def test_uncosted_ops_fail_unless_skipped() -> None:
    from hardware import load_hardware
    from simulators import UncostedOpsError

    graph = OpGraph(metadata=GraphMetadata(model="g"), ops=(Gemm(id=0, m=8, n=8, k=8),), edges=())
    hw = load_hardware("h100")
    with pytest.raises(UncostedOpsError):
        opgraph.run_study(graph, hw, _Declines(), opgraph.study_config())  # type: ignore[arg-type]
    study = opgraph.run_study(graph, hw, _Declines(), opgraph.study_config(skip_uncosted=True))  # type: ignore[arg-type]
    assert study.result.stats().uncosted


def test_progress_is_told_each_sweep_point() -> None:
    hw, model = _hw_model()
    graph = OpGraph(
        metadata=GraphMetadata(model="g"), ops=tuple(Gemm(id=i, m=64, n=64, k=64) for i in range(4)), edges=()
    )
    seen: list[tuple[int, int]] = []
    study = opgraph.run_study(
        graph,
        hw,
        model,
        opgraph.study_config(host_mode="none"),
        engines=[1, 2, 4],
        progress=lambda d, t: seen.append((d, t)),  # type: ignore[arg-type]
    )
    assert sorted(study.results) == [1, 2, 4] and study.sweep is not None
    assert seen == [(1, 4), (2, 4), (4, 4)]
