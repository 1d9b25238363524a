"""A scenario's ``simulation.policy = "file.py:Class"``: loaded from the file, relative to the scenario,
as ``hardware.cost_model`` is (README: scenarios may name a cost model or a policy as ``file.py:Class``)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from opgraph.ir import Edge, Gemm, GraphMetadata, OpGraph, save_graph
from opgraph.scenario import ScenarioError, run_scenario

POLICY_FILE = Path(__file__).resolve().parents[2] / "simulators" / "sim_policies.py"
"""A user's policy (``LongestFirst``) in a plain file."""


def _scenario(tmp_path: Path, policy: str) -> Path:
    study = tmp_path / "study"
    (study / "policies").mkdir(parents=True)
    shutil.copy(POLICY_FILE, study / "policies" / "longest.py")
    graph = OpGraph(
        metadata=GraphMetadata(model="tiny", phase="prefill"),
        ops=tuple(Gemm(id=i, m=8, n=64, k=64 * (i + 1)) for i in range(3)),
        edges=(Edge(src=0, dst=1),),
    )
    save_graph(graph, study / "g.json")
    path = study / "p.scenario.toml"
    path.write_text(
        f'[hardware]\ncost_model = "roofline"\n[simulation]\npolicy = "{policy}"\nengines = 2\n'
        '[[phases]]\ngraph = "g.json"\n'
    )
    return path


def test_a_policy_in_a_file_beside_the_scenario_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _scenario(tmp_path, "policies/longest.py:LongestFirst")
    monkeypatch.chdir(tmp_path)  # the file resolves against the scenario, not the working folder
    summary = run_scenario(path, tmp_path / "out")
    assert summary.passed
    (timeline,) = (tmp_path / "out").glob("*.timeline.json.gz")
    config = json.loads(gzip.decompress(timeline.read_bytes()))["source"]["config"]
    assert config["policy"] == f"{path.parent / 'policies' / 'longest.py'}:LongestFirst"


def test_a_missing_policy_file_names_the_field(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "policies/nope.py:LongestFirst")
    with pytest.raises(ScenarioError) as err:
        run_scenario(path, tmp_path / "out")
    assert err.value.where == f"{path}: simulation.policy"
    assert "no such Python file" in err.value.message
