"""`opgraph validate` (issue 18 item 6): capture, replay, calibrate, a profiled run, simulate and compare in one
command, into one folder written whole or not at all. On the CPU end to end with a tiny llama; the CUDA
run (issue times, cold L2) skips without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, cli_runner, one_error_line

from opgraph.cli.app import app
from opgraph.cli.commands.validate import ValidationSummary
from opgraph.compare import cpu_device_view
from opgraph.ir import OpgraphError, Span, Timeline, TimelineKind, TimelineSource, load_graph, load_timeline

FAST = ["--max-time", "0.02", "--wall-repeats", "1", "--no-check"]
FILES = {
    "summary.json", "graph.json.gz", "replay.jsonl", "calibrated.json", "profiled.graph.json.gz",
    "measured.timeline.json.gz", "simulated.timeline.json.gz", "comparison.json",
}  # fmt: skip


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


@pytest.fixture(scope="module")
def validated(config: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("runs") / "val"
    res = cli_runner().invoke(
        app, ["validate", str(config), "--device", "cpu", "--seq-len", "16", "-o", str(out), *FAST]
    )
    assert res.exit_code == 0, res.stdout + res.stderr
    return out, res.stdout


def test_validate_on_cpu_writes_every_step_into_one_folder(validated: tuple[Path, str]) -> None:
    out, stdout = validated
    assert {p.name for p in out.iterdir()} == FILES
    summary = ValidationSummary.model_validate_json((out / "summary.json").read_text())
    done = {s.name: s.done for s in summary.steps}
    assert done == {"capture": True, "replay": True, "issue": False, "calibrate": True, "profile": True,
                    "simulate": True, "compare": True}  # fmt: skip
    issue = next(s for s in summary.steps if s.name == "issue")
    assert "CUDA" in issue.detail  # skipped with the reason
    assert summary.settings["seq_len"] == 16 and summary.hardware == "xeon-8480"
    assert load_graph(out / "graph.json.gz").metadata.host_timing is not None  # captured with --host-timing
    assert summary.gpu_time_err is not None and summary.wall_time_err is not None
    # what it prints: the end-to-end and per-kind tables, and how the CPU run was measured
    assert "End to end" in stdout and "By kind" in stdout and "gemm" in stdout
    assert "the CPU is the device" in stdout


def test_the_simulation_is_the_calibrated_replay_op_for_op(validated: tuple[Path, str]) -> None:
    # The calibrated table returns each replayed config's measured time, and the profiled graph is the
    # replayed graph op for op: the simulated device time is the replay's time summed over op uses.
    out, _ = validated
    from validators import load_results

    replayed_us = sum(r.timing.median_us * r.count for r in load_results(out / "replay.jsonl") if r.timing)
    comparison = json.loads((out / "comparison.json").read_text())
    gpu = next(r for r in comparison["end_to_end"] if r["metric"] == "gpu_time")
    assert gpu["predicted_us"] == pytest.approx(replayed_us, rel=1e-6)
    graph = load_graph(out / "profiled.graph.json.gz")
    assert comparison["matched"] == len(graph.ops)  # every op joined by id with the measured run
    measured = load_timeline(out / "measured.timeline.json.gz")
    assert {s.op_id for s in measured.spans} == {op.id for op in graph.ops}


def test_validate_a_graph_takes_its_capture_settings(config: Path, tmp_path: Path) -> None:
    graph = tmp_path / "g.json.gz"
    res = cli_runner().invoke(app, ["capture", str(config), "-o", str(graph), "--seq-len", "8", "--phase", "prefill"])
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "val"
    res = cli_runner().invoke(app, ["validate", str(graph), "--model", str(config), "-d", "cpu", "-o", str(out), *FAST])
    assert res.exit_code == 0, res.stdout + res.stderr
    summary = ValidationSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.settings["seq_len"] == 8
    assert "no host timing" in " ".join(summary.notes)  # the given graph was captured without it
    profiled = load_graph(out / "profiled.graph.json.gz")
    assert sorted(o.definition for o in profiled.ops) == sorted(o.definition for o in load_graph(graph).ops)


def test_bad_input_is_one_line_and_leaves_the_folder(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = cli_runner()
    assert "--device" in one_error_line(
        r.invoke(app, ["validate", str(config), "-d", "tpu", "-o", str(tmp_path / "o")])
    )
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "file" in one_error_line(r.invoke(app, ["validate", str(config), "-d", "cpu", "-o", str(a_file)]))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert "summary.json" in one_error_line(r.invoke(app, ["validate", str(config), "-d", "cpu", "-o", str(foreign)]))
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]
    err = one_error_line(
        r.invoke(app, ["validate", str(config), "--model", "x", "-d", "cpu", "-o", str(tmp_path / "o")])
    )
    assert "--model" in err
    # a graph whose model name cannot be found (a config.json elsewhere): say to give --model
    graph = tmp_path / "g.json.gz"
    monkeypatch.chdir(config.parent)
    assert r.invoke(app, ["capture", "config.json", "-o", str(graph), "--seq-len", "8"]).exit_code == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    err = one_error_line(r.invoke(app, ["validate", str(graph), "-d", "cpu", "-o", str(tmp_path / "o")]))
    assert "--model" in err and str(graph) in err
    assert not (tmp_path / "o").exists()


def test_a_failed_run_leaves_an_earlier_folder_as_it_was(
    validated: tuple[Path, str], config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = validated
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*_a: object, **_k: object) -> None:
        raise OpgraphError("the profiler broke", where="profile")

    monkeypatch.setattr("opgraph.capture.profile.profile_capture", broken)
    res = cli_runner().invoke(app, ["validate", str(config), "-d", "cpu", "--seq-len", "16", "-o", str(out), *FAST])
    assert "the profiler broke" in one_error_line(res)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".val.partial-")]


def test_cpu_device_view_counts_nested_cpu_ops_once() -> None:
    src = TimelineSource(kind=TimelineKind.MEASURED, name="m")
    spans = [
        Span(name="aten::linear", track="cpu 1", start_us=0, dur_us=10, op_id=1, category="cpu_op"),
        Span(name="aten::addmm", track="cpu 1", start_us=2, dur_us=6, op_id=1, category="cpu_op"),  # nested
        Span(name="aten::add", track="cpu 1", start_us=20, dur_us=5, op_id=1, category="cpu_op"),
        Span(name="aten::mul", track="cpu 1", start_us=12, dur_us=3, op_id=2, category="cpu_op"),
        Span(name="aten::empty", track="cpu 1", start_us=30, dur_us=3, op_id=None, category="cpu_op"),
    ]
    view = cpu_device_view(Timeline(source=src, spans=tuple(spans)))
    assert all(s.on_device for s in view.spans)
    per_op: dict[int | None, float] = {}
    for s in view.spans:
        per_op[s.op_id] = per_op.get(s.op_id, 0.0) + s.dur_us
    assert per_op == {1: 15.0, 2: 3.0}


def test_validate_on_cuda(config: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the issue timing and the cold-L2 replay need one")
    out = tmp_path / "val"
    res = cli_runner().invoke(app, ["validate", str(config), "--seq-len", "16", "-o", str(out), "--max-time", "0.05"])
    assert res.exit_code == 0, res.stdout + res.stderr
    summary = ValidationSummary.model_validate_json((out / "summary.json").read_text())
    assert all(s.done for s in summary.steps)
    assert (out / "issue.json").is_file()
    replay = next(s for s in summary.steps if s.name == "replay")
    assert "--cold-l2" in replay.command


def test_the_simulate_command_it_names_reproduces_its_prediction(validated: tuple[Path, str], tmp_path: Path) -> None:
    # "The CLI is the method": the simulate step's command, run on the folder's files, gives the same makespan.
    import shlex

    out, _ = validated
    summary = ValidationSummary.model_validate_json((out / "summary.json").read_text())
    command = next(s.command for s in summary.steps if s.name == "simulate")
    args = shlex.split(command)
    assert args[0] == "opgraph"
    stats = tmp_path / "stats.json"
    res = cli_runner().invoke(app, [*args[1:], "--stats", str(stats)])
    assert res.exit_code == 0, res.stderr
    simulated = load_timeline(out / "simulated.timeline.json.gz")
    assert json.loads(stats.read_text())["makespan_us"] == pytest.approx(simulated.makespan_us, rel=1e-9)
    assert load_graph(out / "profiled.graph.json.gz").metadata.host_timing is not None  # the meta's host gaps


def test_a_moe_run_says_whether_its_routing_was_the_models_own(tmp_path: Path) -> None:
    # Issue 18 item 5: accuracy runs must measure the unmodified model. When capture's profiled run
    # replaced the routing (modelled, balanced), validate says so in its notes and summary.
    config = tmp_path / "moe.json"
    moe = {**TINY_LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_hidden_layers": 1,
           "num_local_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    config.write_text(json.dumps(moe))
    out = tmp_path / "val"
    res = cli_runner().invoke(app, ["validate", str(config), "-d", "cpu", "--seq-len", "16", "-o", str(out), *FAST])
    assert res.exit_code == 0, res.stdout + res.stderr
    profiled = load_graph(out / "profiled.graph.json.gz")
    assert any(op.kind.value == "moe_routing" for op in profiled.ops)
    modelled = any("MoE routing is modelled" in a for a in profiled.metadata.assumptions)
    summary = ValidationSummary.model_validate_json((out / "summary.json").read_text())
    said = [n for n in summary.notes if "not the unmodified model" in n]
    assert bool(said) == modelled
    assert bool(said) == ("not the unmodified model" in res.stdout)
