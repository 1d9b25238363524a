"""Host profiles: the fit recovers the framework gaps it is given, the lookup falls back key by key,
files fail in one line, and the profile's CPU is checked against the device's host."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from hardware.hostfit import describe_walls, fit_host_profile, fit_wall_terms, main
from hardware.hostprofile import (
    GapStat,
    HostInfo,
    HostProfile,
    HostProfileWarning,
    check_host_cpu,
    forward_starts,
    in_context,
    in_generate_loop,
    load_host_profile,
    predict_gaps,
)
from opgraph.ir import (
    SAMPLER_SCOPE,
    CaptureSettings,
    Elementwise,
    Gemm,
    GraphMetadata,
    HostIssue,
    LoadError,
    Norm,
    OpBase,
    OpGraph,
    OpgraphError,
    SchemaVersionError,
    Stage,
)
from tests.hardware.host_builders import layer_ops, toy_graph, toy_profile


def test_fit_recovers_the_known_gaps_of_an_unseen_graph() -> None:
    # Three timed graphs whose gaps are the truth plus -1, 0 and +1 us: the medians are the truth.
    prof = toy_profile()
    target = toy_graph(5, timed=False)  # a longer graph, never timed
    pred = predict_gaps(target, prof)
    truth = [op for layer in range(5) for op in layer_ops(layer, 4 * layer, 0.0)]
    assert pred.gaps_us == [op.host_gap_us for op in truth]
    assert pred.levels == {"exact": 20}
    assert prof.exact["decode|norm|LlamaRMSNorm|model.layers.*.input_layernorm|entry"] == GapStat(
        median_us=40.0, p10_us=39.0, p90_us=41.0, n=7
    )
    assert [t.ops for t in prof.training] == [8, 12, 8]


def test_the_first_op_of_a_module_call_pays_more_than_the_next() -> None:
    prof = toy_profile()
    entry, inner = prof.kind["elementwise|entry"].median_us, prof.kind["elementwise|inner"].median_us
    assert (entry, inner) == (12.0, 3.0)


def test_lookup_falls_back_from_exact_to_target_to_kind_to_global() -> None:
    prof = toy_profile()
    s = Stage.DECODE
    ops: list[OpBase] = [
        # exact key: known stage, kind, target, role and position
        Norm(id=0, hidden=64, rows=4, target="LlamaRMSNorm", scope="model.layers.7.input_layernorm", stage=s),
        # another module, same kind+target+position as the up_proj: kind+target
        Gemm(id=1, m=4, n=64, k=64, target="aten.mm.default", scope="model.layers.7.self_attn.q_proj", stage=s),
        # an elementwise target never seen, entering a module: kind
        Elementwise(id=2, fn="sub", numel=8, target="aten.sub.Tensor", scope="model.layers.7.other", stage=s),
        # a norm inside a module call, which no training op was: global median
        Norm(id=3, hidden=64, rows=4, target="LlamaRMSNorm", scope="model.layers.7.other", stage=s),
    ]
    pred = predict_gaps(OpGraph(ops=tuple(ops)), prof)
    assert pred.levels == {"exact": 1, "target": 1, "kind": 1, "global": 1}
    assert pred.gaps_us == [40.0, 25.0, 12.0, prof.global_gap.median_us]
    assert pred.describe() == "1 exact key, 1 kind+target, 1 kind only, 1 global median"


def test_fit_refuses_untimed_graphs_and_mixed_cpus() -> None:
    with pytest.raises(OpgraphError, match="no host timing"):
        fit_host_profile([toy_graph(2), toy_graph(2, timed=False)])
    with pytest.raises(OpgraphError, match="2 CPUs"):
        fit_host_profile([toy_graph(2, cpu="A"), toy_graph(2, cpu="B")])
    with pytest.raises(OpgraphError, match="no training graphs"):
        fit_host_profile([])


def test_saved_profile_round_trips(tmp_path: Path) -> None:
    prof = toy_profile(issue_us=12.5)
    path = prof.save(tmp_path / "toy.host.json")
    assert load_host_profile(path) == prof


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda text: text[: len(text) // 2], LoadError, "truncated or not valid JSON"),
        (lambda text: text.replace('"schema_version":2', '"schema_version":0'), SchemaVersionError, "older"),
        (lambda text: text.replace('"schema_version":2', '"schema_version":9'), SchemaVersionError, "newer"),
        (lambda text: text.replace('"schema_version":2', '"schema_version":true'), LoadError, "bad schema_version"),
        (lambda text: text.replace("opgraph.host_profile", "opgraph.device_profile"), LoadError, "not a host profile"),
        (lambda text: text.replace('"median_us":40.0', '"median_us":-1'), LoadError, "invalid host profile"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, edit, error, match) -> None:  # type: ignore[no-untyped-def]
    path = toy_profile().save(tmp_path / "toy.host.json")
    path.write_text(edit(path.read_text()))
    with pytest.raises(error, match=match) as info:
        load_host_profile(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_profile_of_another_cpu_than_the_device_profile_host_warns() -> None:
    from hardware.profile import hardware_profile, load_profile

    path = hardware_profile("h100")
    assert path is not None
    host_cpu = load_profile(path).device.host_cpu
    same = toy_profile(host=HostInfo(cpu=host_cpu))
    other = toy_profile(host=HostInfo(cpu=host_cpu + " (another one)"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_host_cpu(same, "h100-sxm", "same.host.json") is None
        assert check_host_cpu(other, "a6000", "other.host.json") is None  # a6000 ships no device profile
    with pytest.warns(HostProfileWarning, match="another one"):
        assert check_host_cpu(other, "h100-sxm", "other.host.json") is not None


def test_hostfit_command_writes_a_profile_and_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from opgraph.ir import save_graph

    files = [save_graph(toy_graph(2, n), tmp_path / f"g{i}.json") for i, n in enumerate((-1.0, 1.0, 0.0))]
    out = tmp_path / "toy.host.json"
    assert main([*map(str, files), "-o", str(out), "--note", "toy"]) == 0
    prof = load_host_profile(out)
    assert prof.notes == ("toy",) and prof.host.cpu == "Toy CPU" and prof.issue_us is None
    untimed = save_graph(toy_graph(2, timed=False), tmp_path / "untimed.json")
    assert main([str(untimed), "-o", str(tmp_path / "x.host.json")]) == 2
    err = capsys.readouterr().err
    assert "has no host timing" in err and err.count("\n") == 1


def test_catalog_host_profile_key_must_be_a_file_name(tmp_path: Path) -> None:
    from hardware import load_hardware

    bad = tmp_path / "dev.toml"
    bad.write_text('base = "h100"\nname = "dev"\nhost_profile = 3\n')
    with pytest.raises(LoadError, match="host_profile: expected a file name"):
        load_hardware(bad)


def test_a_user_toml_registers_its_host_profile(tmp_path: Path) -> None:
    from hardware import load_hardware
    from hardware.hostprofile import hardware_host_profile

    prof_path = toy_profile().save(tmp_path / "toy.host.json")
    toml = tmp_path / "dev.toml"
    toml.write_text('base = "h100"\nname = "dev-with-host"\nhost_profile = "toy.host.json"\n')
    spec = load_hardware(toml)
    assert hardware_host_profile(spec) == prof_path
    assert hardware_host_profile("a6000") is None


def test_json_profile_is_plain_data(tmp_path: Path) -> None:
    raw = json.loads(toy_profile().save(tmp_path / "t.host.json").read_text())
    assert raw["format"] == "opgraph.host_profile" and raw["schema_version"] == 2


def test_a_version_1_profile_still_reads_without_fallback_loops(tmp_path: Path) -> None:
    # Version 2 added grouped_fallback (a field with a default): a version-1 file is the same data.
    path = tmp_path / "v1.host.json"
    raw = json.loads(toy_profile().save(path).read_text())
    raw["schema_version"] = 1
    del raw["grouped_fallback"]
    path.write_text(json.dumps(raw))
    prof = load_host_profile(path)
    assert prof.grouped_fallback == () and prof.schema_version == 1
    assert set(raw["host"]) >= {"cpu", "cores", "torch", "transformers", "python", "date"}


def _devices_with_host_profiles() -> list[str]:
    from hardware import list_hardware
    from hardware.hostprofile import hardware_host_profile

    return [hw.name for hw in list_hardware() if hardware_host_profile(hw) is not None]


@pytest.mark.parametrize("name", _devices_with_host_profiles())
def test_shipped_host_profiles_load_and_are_of_the_device_profile_host(name: str) -> None:
    from hardware.hostprofile import device_host_cpu, hardware_host_profile

    path = hardware_host_profile(name)
    assert path is not None
    prof = load_host_profile(path)
    assert prof.host.cpu == device_host_cpu(name)
    assert prof.training and prof.issue_us is not None


def _two_step_graph() -> OpGraph:
    """A toy generate graph: a prefill step (step 0) and a decode step (step 1), two ops each."""
    ops = [op.model_copy(update={"step": 0, "stage": Stage.PREFILL}) for op in layer_ops(0, 0, 0.0)[:2]]
    ops += [op.model_copy(update={"step": 1}) for op in layer_ops(0, 2, 0.0)[:2]]
    md = GraphMetadata(model="toy", phase="generate", capture=CaptureSettings(batch=1))
    return OpGraph(metadata=md, ops=tuple(ops))


def test_in_context_scales_every_op_and_charges_each_forward_once() -> None:
    g = _two_step_graph()
    assert forward_starts(g) == [0, 2]
    prof = toy_profile(op_scale=2.0, forward_us=100.0)
    assert in_context([1.0, 2.0, 3.0, 4.0], g, prof) == [102.0, 4.0, 106.0, 8.0]
    assert in_context([1.0, 2.0, 3.0, 4.0], g, toy_profile()) == [1.0, 2.0, 3.0, 4.0]


def test_generate_loop_terms_go_on_each_steps_first_sampler_op_and_before_the_prompt() -> None:
    g = _two_step_graph()
    sampled = [op.model_copy(update={"scope": SAMPLER_SCOPE}) if op.id in (1, 3) else op for op in g.ops]
    g = OpGraph(metadata=g.metadata, ops=tuple(sampled))
    prof = toy_profile(generate_step_us=300.0, generate_setup_us=1000.0)
    assert in_generate_loop([1.0, 2.0, 3.0, 4.0], g, prof) == [1001.0, 302.0, 3.0, 304.0]
    assert in_generate_loop([1.0, 2.0, 3.0, 4.0], g, toy_profile()) == [1.0, 2.0, 3.0, 4.0]
    # A window of later steps (no step 0) pays no set-up; a step without a sampler, no step term.
    later = OpGraph(metadata=g.metadata, ops=tuple(op.model_copy(update={"step": 5}) for op in g.ops[2:]))
    assert in_generate_loop([3.0, 4.0], later, prof) == [3.0, 304.0]


def _toy_wall(host_us: dict[str, float], device_us: dict[str, float]) -> Callable[[OpGraph, HostProfile], float]:
    """Walls of toy graphs named by their model: host-bound ones pay scale x host + forward time, a
    device-bound one its device time."""

    def wall(graph: OpGraph, profile: HostProfile) -> float:
        name = graph.metadata.model
        return max(profile.op_scale * host_us[name] + profile.forward_us, device_us[name])

    return wall


def _named(name: str) -> OpGraph:
    g = toy_graph(1)
    return g.model_copy(update={"metadata": g.metadata.model_copy(update={"model": name})})


def test_wall_fit_tells_the_per_forward_time_from_the_per_op_scale() -> None:
    host = {"l1": 900.0, "l3": 2500.0, "l5": 4100.0, "gpu": 1000.0}
    device = {"l1": 100.0, "l3": 300.0, "l5": 500.0, "gpu": 20000.0}
    graphs = {n: _named(n) for n in host}
    true_scale, true_forward = 1.2, 700.0
    walls = {n: max(true_scale * host[n] + true_forward, device[n]) for n in host}
    fitted = fit_wall_terms(toy_profile(), graphs, walls, _toy_wall(host, device))
    assert fitted.op_scale == pytest.approx(true_scale, rel=1e-3)
    assert fitted.forward_us == pytest.approx(true_forward, abs=2.0)
    by_name = {w.name: w for w in fitted.walls}
    assert by_name["l3"].predicted_us == pytest.approx(walls["l3"], rel=1e-3)
    assert by_name["l3"].unfitted_us == pytest.approx(host["l3"])  # scale 1, no forward time
    # the gap tables are kept as fitted from the captures
    assert fitted.exact == toy_profile().exact
    assert "x1.200" in describe_walls(fitted)[0] and len(describe_walls(fitted)) == 1 + len(host)


def test_wall_fit_needs_two_walls_of_different_host_time() -> None:
    host, device = {"a": 1000.0, "b": 1000.0}, {"a": 0.0, "b": 0.0}
    graphs = {n: _named(n) for n in host}
    with pytest.raises(OpgraphError, match="two or more"):
        fit_wall_terms(toy_profile(), {"a": graphs["a"]}, {"a": 1500.0}, _toy_wall(host, device))
    with pytest.raises(OpgraphError, match="do not tell"):
        fit_wall_terms(toy_profile(), graphs, {"a": 1500.0, "b": 1500.0}, _toy_wall(host, device))


def test_a_profile_without_wall_terms_loads_as_scale_one_and_no_forward_time(tmp_path: Path) -> None:
    raw = json.loads(toy_profile().model_dump_json())
    for key in ("op_scale", "forward_us", "walls"):
        raw.pop(key)
    path = tmp_path / "old.host.json"
    path.write_text(json.dumps(raw))
    prof = load_host_profile(path)
    assert (prof.op_scale, prof.forward_us, prof.walls) == (1.0, 0.0, ())


def test_robust_wall_fit_is_not_pulled_by_a_wall_taken_while_the_host_was_disturbed() -> None:
    host = {"l1": 900.0, "l3": 2500.0, "l5": 4100.0, "b1": 1000.0, "b3": 2600.0, "b5": 4200.0}
    device = dict.fromkeys(host, 0.0)
    graphs = {n: _named(n) for n in host}
    walls = {n: 1.1 * h + 800.0 for n, h in host.items()}
    walls["l5"] *= 1.4  # one median taken while the host ran slow
    robust = fit_wall_terms(toy_profile(), graphs, walls, _toy_wall(host, device))
    squares = fit_wall_terms(toy_profile(), graphs, walls, _toy_wall(host, device), robust=False)
    assert robust.op_scale == pytest.approx(1.1, rel=0.02) and robust.forward_us == pytest.approx(800.0, abs=50.0)
    assert abs(squares.op_scale - 1.1) > 3 * abs(robust.op_scale - 1.1)  # least squares follows the disturbed wall


def test_in_context_slows_the_host_of_a_forward_by_its_device_busy_share() -> None:
    g = _two_step_graph()
    prof = toy_profile(busy_scale=0.5)
    # step 0: device 10 of host 20 us (u = 0.5): x1.25; step 1: device 100 of host 10 us (u capped at 1): x1.5
    assert in_context([5.0, 15.0, 4.0, 6.0], g, prof, [4.0, 6.0, 60.0, 40.0]) == [6.25, 18.75, 6.0, 9.0]
    assert in_context([5.0, 15.0, 4.0, 6.0], g, prof) == [5.0, 15.0, 4.0, 6.0]  # no device times: no busy term


def test_wall_fit_finds_a_host_slowdown_with_device_busy_share_when_the_walls_show_it() -> None:
    host = {"l1": 900.0, "l3": 2500.0, "l5": 4100.0, "h1": 1000.0, "h3": 2600.0, "h5": 4200.0}
    busy = {"l1": 0.1, "l3": 0.1, "l5": 0.1, "h1": 0.9, "h3": 0.9, "h5": 0.9}

    def wall(graph: OpGraph, profile: HostProfile) -> float:
        n = graph.metadata.model
        return profile.op_scale * (1 + profile.busy_scale * busy[n]) * host[n] + profile.forward_us

    graphs = {n: _named(n) for n in host}
    truth = toy_profile(op_scale=1.1, busy_scale=0.3, forward_us=600.0)
    walls = {n: wall(graphs[n], truth) for n in host}
    fitted = fit_wall_terms(toy_profile(), graphs, walls, wall)
    assert fitted.op_scale == pytest.approx(1.1, rel=0.01)
    assert fitted.busy_scale == pytest.approx(0.3, abs=0.01)
    assert fitted.forward_us == pytest.approx(600.0, abs=10.0)
    assert "device busy share" in describe_walls(fitted)[0]
    # walls that show no such slowdown leave it at 0 (never negative)
    flat = {n: 1.1 * host[n] + 600.0 - 300.0 * busy[n] for n in host}
    assert fit_wall_terms(toy_profile(), graphs, flat, wall).busy_scale == 0.0


def test_a_training_graph_timed_while_the_host_was_disturbed_is_left_out() -> None:
    slow = toy_graph(2)
    slow = slow.model_copy(
        update={"ops": tuple(op.model_copy(update={"host_gap_us": 5 * (op.host_gap_us or 0.0)}) for op in slow.ops)}
    )
    clean = fit_host_profile([toy_graph(2), toy_graph(3), toy_graph(2)])
    prof = fit_host_profile([toy_graph(2), toy_graph(3), toy_graph(2), slow])
    assert prof.exact == clean.exact and len(prof.training) == 3
    assert any(n.startswith("left out toy decode") and "5.0x the median" in n for n in prof.notes)
    kept = fit_host_profile([toy_graph(2), toy_graph(3), toy_graph(2), slow], max_outlier=None)
    assert len(kept.training) == 4 and kept.exact != clean.exact


def _with_nested(g: OpGraph, ids: set[int]) -> OpGraph:
    ops = tuple(op.model_copy(update={"issue": HostIssue.NESTED}) if op.id in ids else op for op in g.ops)
    return g.model_copy(update={"ops": ops})


def test_in_context_scales_nested_calls_by_their_own_term() -> None:
    g = _with_nested(_two_step_graph(), {1})
    prof = toy_profile(op_scale=2.0, forward_us=100.0, nested_scale=0.5, busy_scale=1.0)
    # op 1 is issued from C++ inside op 0: x0.5, no busy slowdown; the others x2 x(1 + u)
    assert in_context([1.0, 4.0, 3.0, 4.0], g, prof) == [102.0, 2.0, 106.0, 8.0]
    assert in_context([10.0, 10.0, 3.0, 4.0], g, prof, [0.0, 20.0, 0.0, 0.0]) == [140.0, 5.0, 106.0, 8.0]


def test_wall_fit_tells_the_nested_calls_scale_when_training_graphs_hold_them() -> None:
    host = {"l1": 900.0, "l3": 2500.0, "l5": 4100.0, "m1": 1000.0, "m3": 2600.0}
    nested = {"l1": 0.0, "l3": 0.0, "l5": 0.0, "m1": 1500.0, "m3": 4500.0}

    def wall(graph: OpGraph, profile: HostProfile) -> float:
        n = graph.metadata.model
        return profile.op_scale * host[n] + profile.nested_scale * nested[n] + profile.forward_us

    graphs = {n: _with_nested(_named(n), {0}) if nested[n] else _named(n) for n in host}
    truth = toy_profile(op_scale=1.1, nested_scale=0.6, forward_us=700.0)
    walls = {n: wall(graphs[n], truth) for n in host}
    fitted = fit_wall_terms(toy_profile(), graphs, walls, wall)
    assert fitted.nested_scale == pytest.approx(0.6, rel=0.01)
    assert fitted.op_scale == pytest.approx(1.1, rel=0.01)
    assert "nested calls' issue time x0.600" in describe_walls(fitted)[0]
    # Without a graph holding nested calls the term is not fitted: it stays 1.
    dense = {n: g for n, g in graphs.items() if not nested[n]}
    assert fit_wall_terms(toy_profile(), dense, walls, wall).nested_scale == 1.0
