"""Running scenarios: artefacts, expectations, comparison with a measured run, replay, TP, bad input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from opgraph.ir import load_graph, load_timeline
from opgraph.scenario import ScenarioError, ScenarioSummary, failure_lines, planned_checks, run_scenario
from opgraph.scenario.model import load_scenario

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "h100"
GRAPH = "llama-3.2-1b-l2-prefill256.graph.json.gz"
MEASURED = "llama-3.2-1b-l2-prefill256.h100.timeline.json.gz"


def measured_scenario(tmp_path: Path, extra: str = "") -> Path:
    """A scenario beside a data folder: the H100 graph and its measured timeline, by relative paths."""
    data = tmp_path / "study" / "data"
    data.mkdir(parents=True)
    shutil.copy(DATA / GRAPH, data / GRAPH)
    shutil.copy(DATA / MEASURED, data / MEASURED)
    path = tmp_path / "study" / "measured.scenario.toml"
    path.write_text(
        f"""
name = "l1b-h100"
[simulation]
engines = [1, 2]
[[phases]]
name = "prefill256"
graph = "data/{GRAPH}"
measured = "data/{MEASURED}"
[expect]
operators = "llama"
max_error = {{ gpu_time = 0.5, median_op = 0.9 }}
makespan_us = {{ min = 100, max = 5000 }}
{extra}
"""
    )
    return path


def by_id(summary: ScenarioSummary) -> dict[str, bool]:
    return {e.id: e.passed for e in summary.expectations}


def test_graph_and_measured_scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = measured_scenario(tmp_path)
    monkeypatch.chdir(tmp_path)  # paths resolve against the scenario file, not the working folder
    steps: list[str] = []
    summary = run_scenario(path, tmp_path / "out", progress=lambda text, done, total: steps.append(text))
    assert steps[0].startswith("resolving") and steps[-1] == "done"
    assert summary.passed, failure_lines(summary)
    assert list(by_id(summary)) == planned_checks(load_scenario(path))
    (phase,) = summary.phases
    assert phase.name == "prefill256" and phase.model == "llama-3.2-1b" and phase.ops == 48
    assert [r.engines for r in phase.sweep] == [1, 2]
    assert phase.sweep[1].makespan_us <= phase.sweep[0].makespan_us
    assert phase.critical_path_us <= phase.sweep[1].makespan_us + 1e-6
    cmp = phase.comparison
    assert cmp is not None and cmp.join == "op_id" and cmp.matched == 48 and cmp.engines == 1
    assert cmp.measured == str(tmp_path / "study" / "data" / MEASURED)
    # The summary's error is the comparison's, not a copy of a constant.
    sim = load_timeline(tmp_path / "out" / "prefill256.1eng.timeline.json.gz")
    ref = load_timeline(DATA / MEASURED)
    from opgraph.compare import compare_timelines

    direct = compare_timelines(sim, ref)
    assert cmp.gpu_time_error == pytest.approx(direct.row("gpu_time").rel_error)

    out = tmp_path / "out"
    for name in summary.artefacts:
        assert (out / name).is_file(), name
    assert {"summary.json", "report.html", "trace.perfetto.json.gz", "prefill256.graph.json.gz"} <= set(
        summary.artefacts
    )
    assert load_graph(out / "prefill256.graph.json.gz") == load_graph(DATA / GRAPH)
    saved = ScenarioSummary.model_validate_json((out / "summary.json").read_text())
    assert saved.model_dump(exclude={"elapsed_s"}) == summary.model_dump(exclude={"elapsed_s"})
    trace = json.loads(gzip.decompress((out / "trace.perfetto.json.gz").read_bytes()))
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
    assert any("prefill256 1 eng" in p for p in procs) and any("measured" in p for p in procs)
    html = (out / "report.html").read_text()
    assert "Expectations" in html and "engine sweep" in html


def test_failed_expectations_are_listed(tmp_path: Path) -> None:
    path = measured_scenario(tmp_path)
    text = path.read_text().replace("min = 100, max = 5000", "max = 50").replace("gpu_time = 0.5", "gpu_time = 0.01")
    path.write_text(text)
    summary = run_scenario(path, tmp_path / "out")
    assert not summary.passed
    results = by_id(summary)
    assert results["prefill256/operators"]
    assert not results["prefill256/makespan_us"] and not results["prefill256/max_error.gpu_time"]
    assert results["prefill256/max_error.median_op"]
    lines = failure_lines(summary)
    assert len(lines) == 2
    assert lines[0].startswith("prefill256 makespan_us: makespan") and "is not <= 50 us" in lines[0]
    assert "gpu_time error" in lines[1] and "is not <= 1%" in lines[1]
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["passed"] is False


def test_explicit_operator_list_and_missing_operator(tmp_path: Path) -> None:
    path = measured_scenario(tmp_path, "")
    text = path.read_text().replace('operators = "llama"', 'operators = ["linear", "rmsnorm", "softmax"]')
    path.write_text(text)
    summary = run_scenario(path, tmp_path / "out")
    (op,) = [e for e in summary.expectations if e.check == "operators"]
    assert not op.passed and op.value == "softmax"
    assert "missing required operators: softmax" in op.message


def test_tp_scenario_shards_and_simulates_collectives(tmp_path: Path) -> None:
    pytest.importorskip("opgraph.transforms")
    path = measured_scenario(tmp_path)
    text = path.read_text().replace("engines = [1, 2]", "engines = 1\ntp = 2")
    text = text.replace("max_error = { gpu_time = 0.5, median_op = 0.9 }", "")
    path.write_text(text.replace(f'measured = "data/{MEASURED}"', ""))
    summary = run_scenario(path, tmp_path / "out")
    (phase,) = summary.phases
    assert summary.tp == 2
    assert phase.collective_us > 0
    assert phase.ops > 48  # all-reduces inserted
    assert summary.passed, failure_lines(summary)


def test_replay_section_on_cpu(tmp_path: Path) -> None:
    path = measured_scenario(
        tmp_path,
        "replay_failures = 0\n[replay]\ndevice = 'cpu'\nkinds = ['norm', 'elementwise']\nmax_configs = 2\n"
        "max_samples = 3\nmax_time_s = 0.05\n",
    )
    summary = run_scenario(path, tmp_path / "out", reports=False)
    rp = summary.replay
    assert rp is not None and rp.configs == 2 and rp.total_configs > 2
    assert sum(rp.statuses.values()) == 2
    assert by_id(summary)["replay/replay_failures"] == (not {"error", "oom", "mismatch"} & set(rp.statuses))
    lines = (tmp_path / "out" / "replay.jsonl").read_text().splitlines()
    kinds = {json.loads(line)["kind"] for line in lines}
    assert len(lines) == 2 and kinds <= {"norm", "elementwise"}
    assert "report.html" not in summary.artefacts


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('name = "l1b-h100"', 'name = "l1b-h100"\n[hardware]\nname = "h900"', "hardware.name"),
        ('name = "l1b-h100"', 'name = "l1b-h100"\n[hardware]\ncost_model = "magic"', "hardware.cost_model"),
        ("engines = [1, 2]", 'engines = [1, 2]\npolicy = "random"', "simulation.policy"),
        ('operators = "llama"', 'operators = "klingon"', "expect.operators"),
        ('operators = "llama"', 'operators = ["gemm", "warp"]', "expect.operators"),
        (f'graph = "data/{GRAPH}"', 'graph = "data/none.json"', "phases[0].graph"),
        (f'measured = "data/{MEASURED}"', 'measured = "data/none.json"', "phases[0].measured"),
    ],
)
def test_unknown_names_fail_early_naming_the_field(tmp_path: Path, old: str, new: str, field: str) -> None:
    path = measured_scenario(tmp_path)
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(ScenarioError) as info:
        run_scenario(path, tmp_path / "out")
    assert info.value.one_line().startswith(f"{path}: {field}: ")
    assert not (tmp_path / "out").exists()  # nothing long ran, nothing written


def test_unknown_model_names_model_source(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "x.scenario.toml"
    path.write_text('[model]\nsource = "llama-9b"\n[[phases]]\nphase = "decode"\n')
    with pytest.raises(ScenarioError) as info:
        run_scenario(path, tmp_path / "out")
    assert info.value.one_line().startswith(f"{path}: model.source: unknown model 'llama-9b'")


def test_capture_scenario_from_a_local_config(tmp_path: Path) -> None:
    """A model given as a config.json beside the scenario, captured on meta, a sweep, decode phase."""
    pytest.importorskip("torch")
    from opgraph.capture.sources import find_preset

    preset = find_preset("llama-3.2-1b")
    assert preset is not None
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(preset.config))
    path = tmp_path / "cfg.scenario.toml"
    path.write_text(
        """
[model]
source = "cfg/config.json"
layers = 1
[simulation]
engines = "1..3"
host = "none"
[expect]
operators = "auto"
recommended_engines = { max = 3 }
utilization = { min = 0.2 }
[[phases]]
phase = "decode"
batch = 2
kv_len = 64
"""
    )
    summary = run_scenario(path, tmp_path / "out", reports=False)
    assert summary.passed, failure_lines(summary)
    (phase,) = summary.phases
    assert phase.phase == "decode" and phase.coverage is not None and phase.coverage.family == "llama"
    assert [r.engines for r in phase.sweep] == [1, 2, 3]
    assert phase.sweep[0].utilization == pytest.approx(1.0)  # one engine, no host cost: always busy
    best = min(r.makespan_us for r in phase.sweep)
    rec = next(r for r in phase.sweep if r.engines == phase.recommended_engines)
    assert rec.makespan_us <= best * 1.01
