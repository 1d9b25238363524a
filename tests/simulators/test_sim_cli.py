"""``opgraph simulate`` end to end (in-process, and once as a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_graphs import decoder_layers, hw, with_other
from typer.testing import CliRunner, Result

from opgraph.cli.app import app
from opgraph.ir import Edge, load_timeline, save_graph
from simulators import SimulationStats

REPO = Path(__file__).resolve().parents[2]
COST = "sim_graphs:PerOpCost"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    spec = tmp_path / "dev.json"
    spec.write_text(hw(eager_us=10.0, cuda_graph_us=0.5).model_dump_json())
    graph = tmp_path / "dec.json"
    save_graph(decoder_layers(2), graph)
    tp = tmp_path / "dec_tp2.json"
    save_graph(decoder_layers(2, tp=2), tp)
    cyc = decoder_layers(1)
    cyclic = tmp_path / "cyc.json"
    save_graph(cyc.model_copy(update={"edges": (*cyc.edges, Edge(src=7, dst=0))}), cyclic)
    unc = tmp_path / "unc.json"
    save_graph(with_other(decoder_layers(1), 2), unc)
    return {"hw": spec, "graph": graph, "tp": tp, "cyclic": cyclic, "uncosted": unc, "dir": tmp_path}


def _sim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["simulate", *map(str, args)])


def test_simulate_writes_timeline_and_stats(files: dict[str, Path]) -> None:
    out, st = files["dir"] / "sim.json", files["dir"] / "stats.json"
    r = _sim(files["graph"], "-e", "3", "-H", files["hw"], "-c", COST, "--host", "cuda-graph", "-o", out, "--stats", st)
    assert r.exit_code == 0, r.output
    assert "makespan" in r.output and "compute2" in r.output and "critical path" in r.output
    tl = load_timeline(out)
    assert tl.source.config["engines.compute"] == 3 and tl.source.config["host_mode"] == "cuda_graph"
    stats = SimulationStats.model_validate_json(st.read_text())
    assert stats.makespan_us == pytest.approx(tl.wall_us)
    assert {s.track for s in tl.spans} == {"compute0", "compute1", "compute2", "host"}


def test_sweep_names_the_smallest_count_within_one_percent(files: dict[str, Path], golden) -> None:  # type: ignore[no-untyped-def]
    # The seed's study: a hypothetical accelerator whose engines are independent. (PerOpCost gives
    # the MLP GEMMs less time than the test device's bandwidth needs for their weights, so on a
    # shared device gate and up cannot overlap.)
    if "--independent-engines" not in _sim("--help").output:
        pytest.skip("the CLI has no --independent-engines flag yet (SimulationConfig.independent_engines)")
    args = ("-e", "1..6", "-H", files["hw"], "-c", COST, "--host", "none", "--independent-engines")
    r = _sim(files["graph"], *args, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["sweep"]["recommended"] == 3
    golden("simulators/decoder_sweep.json", data["sweep"])
    text = _sim(files["graph"], *args)
    assert "recommended: 3 engine(s)" in text.output


def test_tensor_parallel_run(files: dict[str, Path]) -> None:
    r = _sim(files["tp"], "--tp", "2", "-H", files["hw"], "-c", COST, "--jitter", "0.2", "--json")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output)
    assert stats["ranks"] == 2
    assert {e["track"] for e in stats["engines"]} >= {"rank0/compute0", "rank1/link0"}


@pytest.mark.parametrize(
    ("graph", "extra", "needle"),
    [
        ("graph", ["-e", "0"], "--engines: engine count 0 is out of range"),
        ("graph", ["-e", "three"], "--engines: 'three' is not an engine count"),
        ("graph", ["--policy", "fastest"], "unknown scheduling policy 'fastest'"),
        ("graph", ["--tp", "0"], "--tp: 0 is out of range"),
        ("graph", ["--host", "lazy"], "unknown host mode"),
        ("cyclic", [], "cycle"),
        ("uncosted", [], "2 op(s) cannot be costed by PerOpCost (other×2)"),
    ],
)
def test_bad_options_and_graphs_fail_with_one_line(
    files: dict[str, Path], graph: str, extra: list[str], needle: str
) -> None:
    r = _sim(files[graph], "-H", files["hw"], "-c", COST, *extra)
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


def test_uncosted_ops_name_the_skip_flag_that_runs_without_them(files: dict[str, Path]) -> None:
    r = _sim(files["uncosted"], "-H", files["hw"], "-c", COST)
    assert r.exit_code == 2 and "--skip-uncosted" in r.output
    r = _sim(files["uncosted"], "-H", files["hw"], "-c", COST, "--skip-uncosted")
    assert r.exit_code == 0 and "skipped 2 uncosted op(s)" in r.output


def test_open_goes_through_the_exporters(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph.export

    opened: list[Path] = []
    monkeypatch.setattr(opgraph.export, "open_in_perfetto", lambda path, **kw: opened.append(Path(path)))
    out = files["dir"] / "run.json"
    r = _sim(files["tp"], "--tp", "2", "-H", files["hw"], "-c", COST, "-o", out, "--open")
    assert r.exit_code == 0, r.output
    assert opened and opened[0].exists() and opened[0].name == "run.perfetto.json"
    trace = json.loads(opened[0].read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len({e.get("pid") for e in events if e.get("ph") == "X"}) == 2  # a process per rank


def test_subprocess_exit_code_and_single_line(files: dict[str, Path]) -> None:
    cost = f"{REPO / 'tests' / 'simulators' / 'sim_graphs.py'}:PerOpCost"
    proc = subprocess.run(
        [sys.executable, "-m", "opgraph", "simulate", str(files["cyclic"]), "-H", str(files["hw"]), "-c", cost],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "cycle" in proc.stderr
