"""Framework time in eager simulations: the graph's own host timing, else the host profile the
hardware names (or the config gives), else none; the run's notes say which."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_graphs import PerOpCost, hw
from typer.testing import CliRunner

from hardware.hostprofile import HostInfo
from opgraph.cli.app import app
from opgraph.ir import SAMPLER_SCOPE, save_graph
from simulators import HostConfig, HostMode, SimulationConfig, simulate
from tests.hardware.host_builders import toy_graph, toy_profile

EAGER_US = 1.0
"""Issue time per op of the test device; device time per toy op is 2 us (10 for the GEMM)."""


def _config(**host: object) -> SimulationConfig:
    return SimulationConfig.standard(1, policy="stream", host=HostConfig(mode=HostMode.EAGER, **host))


def _host_bound_wall(gaps: list[float], issue_us: float = EAGER_US) -> float:
    """Wall of a toy graph whose host is the bottleneck: every op's issue and framework time, then the
    last op (2 us) on the device."""
    return sum(issue_us + g for g in gaps) + 2.0


def test_graph_host_timing_wins_over_the_host_profile_which_wins_over_none(tmp_path: Path) -> None:
    profile = toy_profile().save(tmp_path / "toy.host.json")
    timed = toy_graph(2, 5.0)  # its own gaps: the truth + 5 us
    untimed = toy_graph(2, timed=False)
    own = [op.host_gap_us or 0.0 for op in timed.ops]
    truth = [op.host_gap_us or 0.0 for op in toy_graph(2).ops]

    r = simulate(timed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile)))
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(own))
    assert any("the graph's --host-timing" in n for n in r.notes)

    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile)))
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(truth))
    assert any("predicted by the host profile" in n and "8 exact key" in n for n in r.notes)

    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile), framework=False))
    assert not any("framework" in n for n in r.notes)
    r0 = simulate(untimed, hw(EAGER_US), PerOpCost(), _config())  # testdev names no host profile
    assert r.stats().makespan_us == r0.stats().makespan_us < _host_bound_wall(truth)
    assert not any("framework" in n for n in r0.notes)


def test_host_profile_issue_time_replaces_the_spec_default_unless_per_op_is_set(tmp_path: Path) -> None:
    profile = toy_profile(issue_us=4.0).save(tmp_path / "toy.host.json")
    untimed = toy_graph(2, timed=False)
    truth = [op.host_gap_us or 0.0 for op in toy_graph(2).ops]
    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile)))
    assert r.host_per_op_us == 4.0
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(truth, 4.0))
    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile), per_op_us=2.0))
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(truth, 2.0))


def test_cuda_graph_host_mode_takes_no_framework_time(tmp_path: Path) -> None:
    profile = toy_profile().save(tmp_path / "toy.host.json")
    cfg = SimulationConfig.standard(
        1, policy="stream", host=HostConfig(mode=HostMode.CUDA_GRAPH, host_profile=str(profile))
    )
    r = simulate(toy_graph(2, timed=False), hw(EAGER_US), PerOpCost(), cfg)
    assert not any("framework" in n for n in r.notes)


def test_a_host_profile_of_another_cpu_than_the_device_host_is_a_named_warning(tmp_path: Path) -> None:
    from hardware import load_hardware
    from hardware.hostprofile import HostProfileWarning

    profile = toy_profile(host=HostInfo(cpu="Some Other CPU")).save(tmp_path / "toy.host.json")
    with pytest.warns(HostProfileWarning, match="Some Other CPU"):
        r = simulate(toy_graph(2, timed=False), load_hardware("h100"), PerOpCost(), _config(host_profile=str(profile)))
    assert any(n.startswith("warning: host profile") for n in r.notes)


def test_simulate_cli_uses_the_host_profile_the_hardware_names_with_its_device_profile(tmp_path: Path) -> None:
    toy_profile().save(tmp_path / "toy.host.json")
    (tmp_path / "dev.toml").write_text(
        'base = "h100"\nname = "dev-host"\nhost_profile = "toy.host.json"\n[host]\neager_us = 1.0\n'
    )
    graph = save_graph(toy_graph(2, timed=False), tmp_path / "g.json")
    args = ["simulate", str(graph), "-H", str(tmp_path / "dev.toml"), "-c", "host_costs:ProfileModel", "-e", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "predicted by the host profile toy.host.json" in " ".join(r.output.split())
    r = CliRunner().invoke(app, [*args, "--no-framework-time"])
    assert r.exit_code == 0, r.output
    assert "host profile" not in r.output
    # Other cost models (a datasheet one, a calibrated table's kind) keep the spec's host.
    for other in ("sim_graphs:PerOpCost", "host_costs:MeasuredCost"):
        r = CliRunner().invoke(app, [*args[:4], "-c", other, "-e", "1"])
        assert r.exit_code == 0, r.output
        assert "host profile" not in r.output and "framework" not in r.output


def test_simulate_cli_bad_host_profile_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "toy.host.json").write_text('{"format": "opgraph.host_profile", "schema_version": 1, "ho')
    (tmp_path / "dev.toml").write_text('base = "h100"\nname = "dev-bad-host"\nhost_profile = "toy.host.json"\n')
    graph = save_graph(toy_graph(2, timed=False), tmp_path / "g.json")
    args = ["simulate", str(graph), "-H", str(tmp_path / "dev.toml"), "-c", "host_costs:ProfileModel"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2
    assert "truncated or not valid JSON" in r.output and "Traceback" not in r.output


def test_simulate_cli_uses_the_catalog_host_profile_of_the_device(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The catalog entry names its host profile (``host_profile = ...`` in h100-sxm.toml): stand one in,
    # measured on the CPU that measured the device profile, so no warning.
    from hardware import loader
    from hardware.hostprofile import device_host_cpu

    cpu = device_host_cpu("h100-sxm")
    assert cpu
    path = toy_profile(host=HostInfo(cpu=cpu)).save(tmp_path / "h100-sxm.host.json")
    loader.list_hardware()
    monkeypatch.setitem(loader._HOST_PROFILES, "h100-sxm", path)
    graph = save_graph(toy_graph(2, timed=False), tmp_path / "g.json")
    r = CliRunner().invoke(app, ["simulate", str(graph), "-H", "h100", "-c", "host_costs:ProfileModel", "-e", "1"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "predicted by the host profile h100-sxm.host.json" in text and "warning" not in text


def test_fitted_in_context_terms_scale_each_op_and_add_a_time_per_forward(tmp_path: Path) -> None:
    untimed = toy_graph(2, timed=False)
    truth = [op.host_gap_us or 0.0 for op in toy_graph(2).ops]
    plain = toy_profile(issue_us=4.0).save(tmp_path / "plain.host.json")
    fitted = toy_profile(issue_us=4.0, op_scale=1.5, forward_us=30.0).save(tmp_path / "fitted.host.json")
    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(plain)))
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(truth, 4.0))
    assert not any("in context" in n for n in r.notes)
    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(fitted)))
    # host-bound: every op's issue and framework time x1.5, 30 us once (one forward), the last op on the device
    assert r.stats().makespan_us == pytest.approx(1.5 * sum(4.0 + g for g in truth) + 30.0 + 2.0)
    assert any("in context" in n and "x1.500" in n for n in r.notes)
    # a graph carrying its own --host-timing keeps its measured gaps as they are
    timed = toy_graph(2)
    r_own = simulate(timed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(fitted)))
    r_own_plain = simulate(timed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(plain)))
    assert r_own.stats().makespan_us == r_own_plain.stats().makespan_us


def test_in_context_terms_are_not_applied_to_the_steps_of_a_generation(tmp_path: Path) -> None:
    """They were fitted on walls of single forward passes; a generation's steps run in HF's loop."""
    steps = toy_graph(2, timed=False)
    steps = steps.model_copy(update={"metadata": steps.metadata.model_copy(update={"phase": "generate"})})
    plain = toy_profile(issue_us=4.0).save(tmp_path / "plain.host.json")
    fitted = toy_profile(issue_us=4.0, op_scale=1.5, forward_us=30.0).save(tmp_path / "fitted.host.json")
    r = simulate(steps, hw(EAGER_US), PerOpCost(), _config(host_profile=str(fitted)))
    r_plain = simulate(steps, hw(EAGER_US), PerOpCost(), _config(host_profile=str(plain)))
    assert r.stats().makespan_us == r_plain.stats().makespan_us
    assert any("not applied to the steps of a generation" in n for n in r.notes)


def test_generate_loop_terms_add_their_time_per_sampled_step_and_before_the_prompt(tmp_path: Path) -> None:
    """A host-bound generation pays the fitted loop time once per step that samples, the set-up once."""
    steps = toy_graph(2, timed=False)
    half = len(steps.ops) // 2
    ops = tuple(op.model_copy(update={"step": 0 if i < half else 1}) for i, op in enumerate(steps.ops))
    ops = tuple(op.model_copy(update={"scope": SAMPLER_SCOPE}) if op.id == ops[-1].id else op for op in ops)
    md = steps.metadata.model_copy(update={"phase": "generate"})
    steps = steps.model_copy(update={"metadata": md, "ops": ops})
    plain = toy_profile(issue_us=4.0).save(tmp_path / "plain.host.json")
    loop = toy_profile(issue_us=4.0, generate_step_us=50.0, generate_setup_us=200.0).save(tmp_path / "loop.host.json")
    r = simulate(steps, hw(EAGER_US), PerOpCost(), _config(host_profile=str(loop)))
    r_plain = simulate(steps, hw(EAGER_US), PerOpCost(), _config(host_profile=str(plain)))
    assert r.stats().makespan_us == pytest.approx(r_plain.stats().makespan_us + 50.0 + 200.0)
    assert any("generate's loop" in n and "0.050 ms more per step" in n for n in r.notes)
    assert not any("generate's loop" in n for n in r_plain.notes)


def test_a_busy_device_slows_the_host_by_the_fitted_busy_scale(tmp_path: Path) -> None:
    untimed = toy_graph(2, timed=False)
    truth = [op.host_gap_us or 0.0 for op in toy_graph(2).ops]
    fitted = toy_profile(issue_us=4.0, busy_scale=0.5).save(tmp_path / "busy.host.json")
    r = simulate(untimed, hw(EAGER_US), PerOpCost(), _config(host_profile=str(fitted)))
    host = sum(4.0 + g for g in truth)
    device = sum(r.problem.dur_us)  # the toy ops' device times: 2 us each, 10 for the GEMMs
    assert device == 32.0
    assert r.stats().makespan_us == pytest.approx(host * (1 + 0.5 * device / host) + 2.0)
    assert any("busy share" in n for n in r.notes)


def test_a_nested_op_drops_the_framework_time_its_graph_measured_before_it(tmp_path: Path) -> None:
    # --host-timing on meta times the Python that emulates torch's C++ loop before each nested op:
    # none of it runs on the device's host.
    from opgraph.ir import HostIssue

    timed = toy_graph(2)
    ops = list(timed.ops)
    ops[1] = ops[1].model_copy(update={"issue": HostIssue.NESTED})
    nested = timed.model_copy(update={"ops": tuple(ops)})
    own = [0.0 if i == 1 else op.host_gap_us or 0.0 for i, op in enumerate(timed.ops)]
    assert (timed.ops[1].host_gap_us or 0.0) > 0.0
    r = simulate(nested, hw(EAGER_US), PerOpCost(), _config())
    assert r.stats().makespan_us == pytest.approx(_host_bound_wall(own))


def test_ops_marked_as_host_syncs_make_the_eager_host_wait_for_the_device() -> None:
    """An op issued as a host sync (capture marks so the first product of torch's _grouped_mm fallback,
    whose call copies its offsets to the host before it launches) makes an eager host wait for the op
    before it, not for its own kernel; a CUDA-graph host waits for neither."""
    from opgraph.ir import HostIssue

    graph = toy_graph(2, timed=False)
    ops = list(graph.ops)
    ops[2] = ops[2].model_copy(update={"issue": HostIssue.SYNC})  # the op after the 10 us GEMM
    marked = graph.model_copy(update={"ops": tuple(ops)})
    eager = SimulationConfig.standard(
        1, policy="stream", host=HostConfig(mode=HostMode.EAGER, framework=False, sync_each_step=False)
    )
    plain = simulate(graph, hw(EAGER_US), PerOpCost(), eager)
    synced = simulate(marked, hw(EAGER_US), PerOpCost(), eager)
    assert synced.config.host.sync_ops == (ops[1].id,)
    assert synced.stats().makespan_us > plain.stats().makespan_us
    spans = synced.timeline().spans
    host = {s.args["op"]: s for s in spans if s.track == "host"}
    device = {s.op_id: s for s in spans if s.track != "host"}
    gemm_end = device[ops[1].id].start_us + device[ops[1].id].dur_us
    # the sync's call starts once the GEMM is done; the host issues the next op while the sync's kernel runs
    assert host[2].start_us == pytest.approx(gemm_end)
    assert host[3].start_us < device[ops[2].id].start_us + device[ops[2].id].dur_us
    graphs = SimulationConfig.standard(1, policy="stream", host=HostConfig(mode=HostMode.CUDA_GRAPH))
    assert simulate(marked, hw(EAGER_US), PerOpCost(), graphs).config.host.sync_ops == ()


def test_the_grouped_mm_fallbacks_products_take_the_loop_the_host_profile_measured(tmp_path: Path) -> None:
    """The call's first product (a sync) takes the loop's time with one expert, each further (nested)
    product its time per expert, in place of the per-op issue time; ``--host-us`` still sets every op."""
    from hardware.hostprofile import FallbackLoop
    from opgraph.ir import ExpertGemm, Gemm, HostIssue, OpGraph

    expert = ExpertGemm(impl="grouped_mm", experts=8, top_k=2, part="gate_up")
    scope = "model.layers.0.mlp.experts"
    products = tuple(
        Gemm(id=i, m=4, n=64, k=64, expert=expert, scope=scope, issue=HostIssue.SYNC if i == 0 else HostIssue.NESTED)
        for i in range(3)
    )
    graph = OpGraph(metadata=toy_graph(1, timed=False).metadata, ops=products)
    loop = FallbackLoop(experts=8, n=64, k=64, first_us=50.0, per_expert_us=16.0, calls=4)
    with_loop = toy_profile(grouped_fallback=(loop,)).save(tmp_path / "loop.host.json")
    without = toy_profile().save(tmp_path / "plain.host.json")

    def host_us(profile: Path, **host: object) -> tuple[list[float], list[str]]:
        r = simulate(graph, hw(EAGER_US), PerOpCost(), _config(host_profile=str(profile), **host))
        spans = [s for s in r.timeline().spans if s.track == "host"]
        return [s.dur_us for s in sorted(spans, key=lambda s: s.args["op"])], r.notes

    measured, notes = host_us(with_loop)
    gap = measured[0] - 50.0  # the framework time before the call, from the profile's gap tables
    assert gap >= 0.0 and measured[1:] == [16.0, 16.0]  # nested products: no framework time
    assert any("_grouped_mm fallback" in n and "loop.host.json" in n for n in notes)
    plain, plain_notes = host_us(without)
    assert plain == [EAGER_US + gap, EAGER_US, EAGER_US]
    assert not any("_grouped_mm fallback" in n for n in plain_notes)
    given, _ = host_us(with_loop, per_op_us=3.0)
    assert given == [3.0 + gap, 3.0, 3.0]


def test_a_config_files_host_profile_is_the_one_simulate_uses(tmp_path: Path) -> None:
    """`opgraph simulate --config` with ``host.host_profile`` set: that file predicts the framework time."""
    graph = save_graph(toy_graph(2, timed=False), tmp_path / "g.json")
    mine = toy_profile(issue_us=4.0).save(tmp_path / "mine.host.json")
    config = tmp_path / "sim.json"
    config.write_text(SimulationConfig(host=HostConfig(host_profile=str(mine))).model_dump_json())
    r = CliRunner().invoke(app, ["simulate", str(graph), "-H", "a6000", "--config", str(config), "-e", "1"])
    assert r.exit_code == 0, r.output
    # whitespace dropped: a narrow terminal folds the long path anywhere
    assert f"predictedbythehostprofile{mine}" in "".join(r.output.split())


def test_a_device_profiles_issue_times_are_put_on_the_host_profiles_footing() -> None:
    from hardware import ProfileModel, load_hardware, load_profile
    from hardware.hostprofile import hardware_host_profile, load_host_profile
    from hardware.profile import hardware_profile
    from simulators.api import issue_scale

    host_path = hardware_host_profile("h100-sxm")
    assert host_path is not None
    host = load_host_profile(host_path)
    shipped = ProfileModel()  # the footing each device's shipped profile prices ops on
    # Fitted with the H100 sweep's own issue times: nothing to scale there.
    assert issue_scale(host, shipped.issue_basis(load_hardware("h100-sxm"))) == (1.0, "")
    assert issue_scale(host, None) == (1.0, "")
    # The H200 machine has the same CPU model, and the H200 device names the same host profile; its
    # sweep met the host at another speed, so its per-op issue times go by the ratio of the two
    # calibrations of one aten call.
    assert hardware_host_profile("h200") == host_path
    h200 = hardware_profile("h200")
    assert h200 is not None
    device_us = load_profile(h200).aten_issue_us
    assert device_us is not None and host.issue_us is not None
    scale, note = issue_scale(host, shipped.issue_basis(load_hardware("h200")))
    assert scale == pytest.approx(host.issue_us / device_us) and scale != 1.0
    assert "h200.profile.json" in note and f"x{scale:.3f}" in note


def test_simulate_on_h200_says_how_its_issue_times_were_scaled(tmp_path: Path) -> None:
    graph = save_graph(toy_graph(1, timed=False), tmp_path / "g.json")
    res = CliRunner().invoke(app, ["simulate", str(graph), "-H", "h200"])
    assert res.exit_code == 0, res.output
    assert "per-op issue times of h200.profile.json" in res.stdout
    res = CliRunner().invoke(app, ["simulate", str(graph), "-H", "h100"])
    assert res.exit_code == 0, res.output
    assert "per-op issue times of" not in res.stdout


def test_a_users_own_device_profile_is_put_on_the_host_profiles_footing_by_its_own_calibration(tmp_path: Path) -> None:
    """`-c my.profile.json -H h100`: the ops' issue times are the user's sweep's, so the scale is its
    calibration's (here a sweep that met the host twice as slow), not the shipped profile's."""
    import json

    from hardware import load_profile
    from hardware.profile import hardware_profile

    shipped = hardware_profile("h100-sxm")
    assert shipped is not None
    data = json.loads(shipped.read_text())
    data["aten_issue_us"] *= 2
    for p in data["points"]:
        if p.get("host_s"):
            p["host_s"] *= 2
    mine = tmp_path / "mine.profile.json"
    mine.write_text(json.dumps(data))
    assert load_profile(mine).aten_issue_us == pytest.approx(2 * load_profile(shipped).aten_issue_us)
    graph = save_graph(toy_graph(2, timed=False), tmp_path / "g.json")
    walls = {}
    for name, spec in (("shipped", "profile"), ("mine", str(mine))):
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(app, ["simulate", str(graph), "-H", "h100", "-c", spec, "-e", "1", "-o", str(out)])
        assert res.exit_code == 0, res.output
        flat = "".join(res.stdout.split())
        assert ("per-opissuetimesofmine.profile.json" in flat and "x0.500" in flat) == (name == "mine"), res.stdout
        walls[name] = json.loads(out.read_text())["wall_us"]
    assert walls["mine"] == pytest.approx(walls["shipped"], rel=1e-6)
