"""The simulator on hand-made graphs: parallel Q/K/V, host modes, policies, ranks, errors."""

from __future__ import annotations

import math
from collections.abc import Generator

import pytest
from sim_graphs import PerOpCost, chain_graph, decoder_layers, hw, with_other

from hardware import AlphaBetaCollectiveModel, cost_graph
from opgraph.ir import (
    CycleError,
    Edge,
    Elementwise,
    Memory,
    OpGraph,
    RegistryError,
    Span,
    Timeline,
)
from simulators import (
    POLICIES,
    EngineGroup,
    EngineRole,
    FixedCostModel,
    HostConfig,
    HostMode,
    SchedulingPolicy,
    SchedulingProblem,
    SimulationConfig,
    SimulationResult,
    SimulationStats,
    Simulator,
    UncostedOpsError,
    cost_problem,
    get_policy,
    run_problem,
    simulate,
    sweep_engines,
)

NO_HOST = HostConfig(mode=HostMode.NONE)


def _by_op(result: SimulationResult) -> dict[int, Span]:
    return {s.op_id: s for s in result.timeline().spans if s.op_id is not None}


def test_qkv_projections_run_in_parallel() -> None:
    graph = decoder_layers(1)
    res = simulate(graph, hw(), PerOpCost(), SimulationConfig.standard(3, host=NO_HOST))
    spans = _by_op(res)
    q, k, v = spans[1], spans[2], spans[3]
    assert q.start_us == k.start_us == v.start_us == spans[0].end_us
    assert len({q.track, k.track, v.track}) == 3
    one = simulate(graph, hw(), PerOpCost(), SimulationConfig.standard(1, host=NO_HOST))
    assert one.makespan_us == pytest.approx(one.stats().serial_us)
    assert res.makespan_us < one.makespan_us


def test_engine_sweep_finds_three_engines_for_a_decoder_layer() -> None:
    # The seed's study: Q, K and V in parallel make 3 engines the smallest optimal count.
    graph = decoder_layers(2)
    costs = cost_graph(graph, PerOpCost(), hw())
    problem = SchedulingProblem.from_costs(graph, costs.costs, costs.uncosted)
    sweep, results = sweep_engines(problem, SimulationConfig(host=NO_HOST), range(1, 7))
    assert sweep.recommended == 3
    spans = [p.makespan_us for p in sweep.points]
    assert spans == sorted(spans, reverse=True)
    assert sweep.best_makespan_us == pytest.approx(sweep.critical_path_us)
    assert set(results) == set(range(1, 7))


def test_mean_utilization_is_the_sweeps_figure_per_engine_count() -> None:
    # The scenario's sweep rows and the simulator's sweep points read utilisation from one place.
    graph = decoder_layers(2)
    costs = cost_graph(graph, PerOpCost(), hw())
    problem = SchedulingProblem.from_costs(graph, costs.costs, costs.uncosted)
    config = SimulationConfig(host=NO_HOST)
    sweep, results = sweep_engines(problem, config, range(1, 4))
    group = config.compute_group.name
    for point in sweep.points:
        st = results[point.engines].stats()
        assert st.mean_utilization(group) == pytest.approx(point.utilization)
        busy = [e.busy_us for e in st.engines if e.group == group]
        assert st.mean_utilization(group) == pytest.approx(sum(busy) / (len(busy) * st.makespan_us))
    assert results[1].stats().mean_utilization("no-such-group") == 0.0


def test_eager_decode_is_launch_bound_and_cuda_graph_is_not() -> None:
    graph = decoder_layers(4)
    eager = simulate(graph, hw(eager_us=10.0), PerOpCost(), SimulationConfig.standard(1))
    graphed = simulate(
        graph, hw(eager_us=10.0), PerOpCost(), SimulationConfig.standard(1, host=HostConfig(mode=HostMode.CUDA_GRAPH))
    )
    st_e, st_g = eager.stats(), graphed.stats()
    kernels = [i for i, f in enumerate(eager.problem.free) if not f]
    # The eager host needs 10 us per kernel op; the GPU time is smaller, so the host bounds the step.
    assert st_e.makespan_us >= 10.0 * len(kernels)
    assert st_e.makespan_us > 1.5 * st_e.serial_us
    assert st_e.host.host_bound_share > 0.3
    assert st_g.host.host_bound_share < 0.05
    assert st_g.makespan_us == pytest.approx(st_g.serial_us + 0.5)
    # Host spans sit on their own track and cover the per-op overhead.
    host = [s for s in eager.timeline().spans if s.track == "host"]
    assert len(host) == len(kernels) and all(s.dur_us == 10.0 for s in host)


def test_host_waits_for_the_device_between_steps() -> None:
    first = decoder_layers(1, step=0)
    second = decoder_layers(1, step=1, start_id=len(first.ops))
    link = Edge(src=first.ops[-1].id, dst=second.ops[0].id)
    graph = OpGraph(ops=first.ops + second.ops, edges=(*first.edges, link, *second.edges))
    cfg = SimulationConfig.standard(1, host=HostConfig(mode=HostMode.CUDA_GRAPH, per_op_us=1.0))
    synced = simulate(graph, hw(), PerOpCost(), cfg)
    rec = synced.kernel.ranks[0]
    n0 = len(first.ops)
    end0 = rec.start_us[n0 - 1] + rec.dur_us[n0 - 1]
    # The second step is issued only after the first finished on the device.
    assert rec.issue_us[n0] == pytest.approx(end0 + 1.0)
    assert synced.stats().host.sync_points == 1
    free = simulate(
        graph, hw(), PerOpCost(), cfg.model_copy(update={"host": cfg.host.model_copy(update={"sync_each_step": False})})
    )
    assert free.makespan_us < synced.makespan_us


def test_critical_path_policy_beats_program_order() -> None:
    # Program order puts two short independent ops before the head of a long chain.
    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(5))
    edges = (Edge(src=2, dst=3), Edge(src=3, dst=4))
    graph = OpGraph(ops=ops, edges=edges)
    durations = {0: 5.0, 1: 5.0, 2: 1.0, 3: 5.0, 4: 5.0}
    problem = SchedulingProblem.from_durations(graph, durations)
    naive = run_problem(problem, SimulationConfig.standard(1, policy="earliest"))
    cp = run_problem(problem, SimulationConfig.standard(2, policy="critical-path"))
    eager2 = run_problem(problem, SimulationConfig.standard(2, policy="earliest"))
    assert naive.makespan_us == 21.0
    assert cp.makespan_us == 11.0
    assert eager2.makespan_us == 16.0  # 0 and 1 take both engines first, delaying the chain


def test_stream_policy_caps_engines_and_notes_it() -> None:
    graph = decoder_layers(1)
    res = simulate(graph, hw(), PerOpCost(), SimulationConfig.standard(3, policy="stream", host=NO_HOST))
    assert {s.track for s in res.timeline().spans} == {"compute0"}
    assert any("stream" in n for n in res.stats().notes)
    assert res.makespan_us == pytest.approx(res.stats().serial_us)


def test_tensor_parallel_collectives_synchronise_ranks() -> None:
    graph = decoder_layers(2, tp=2)
    cfg = SimulationConfig.standard(1, host=NO_HOST, tp=2, jitter=0.4, seed=3)
    res = simulate(graph, hw(), PerOpCost(), cfg)
    tl = res.timeline()
    coll_ids = [o.id for o in graph.ops if o.kind.value == "collective"]
    for cid in coll_ids:
        spans = [s for s in tl.spans if s.op_id == cid]
        assert {s.track for s in spans} == {"rank0/link0", "rank1/link0"}
        assert spans[0].start_us == spans[1].start_us and spans[0].dur_us == spans[1].dur_us
        # Each rank's collective starts after that op's predecessors ended on *both* ranks.
        preds = [e.src for e in graph.edges if e.dst == cid]
        for r in range(2):
            rec = res.kernel.ranks[r]
            for p in preds:
                assert spans[0].start_us >= rec.start_us[p] + rec.dur_us[p] - 1e-9
    st = res.stats()
    assert st.ranks == 2 and len(st.collective_wait_us) == 2 and sum(st.collective_wait_us) > 0
    assert len(res.rank_timelines()) == 2


def test_collective_time_from_interconnect_when_model_declines() -> None:
    graph = decoder_layers(1, tp=2)

    class NoCollective(FixedCostModel):
        def estimate(self, op, hw_):  # type: ignore[no-untyped-def]
            if op.kind.value == "collective":
                from hardware.base import UncostedOpError

                raise UncostedOpError("no collective formula")
            return super().estimate(op, hw_)

    link = AlphaBetaCollectiveModel()
    report = cost_graph(graph, NoCollective(default_us=2.0), hw(link_gbps=100.0), fallback=link)
    assert report.from_fallback == 1 and not report.uncosted
    coll = next(o for o in graph.ops if o.kind.value == "collective")
    # The one collective formula (it once had a second copy here that disagreed with it).
    want = AlphaBetaCollectiveModel().estimate(coll, hw(link_gbps=100.0))
    assert report.costs[coll.id] == want
    problem, _, _ = cost_problem(graph, NoCollective(default_us=2.0), hw(link_gbps=100.0))
    assert problem.dur_us[coll.id] == want.us
    with pytest.raises(UncostedOpsError, match="collective"):
        simulate(graph, hw(link_gbps=0.0), NoCollective(default_us=2.0), SimulationConfig.standard(1, tp=2))


def test_copy_engines_take_memory_ops() -> None:
    ops = (
        Elementwise(id=0, fn="add", numel=8),
        Memory(id=1, fn="copy", numel=8),
        Elementwise(id=2, fn="add", numel=8),
    )
    graph = OpGraph(ops=ops, edges=())
    cfg = SimulationConfig.standard(1, copy_engines=1, host=NO_HOST)
    res = simulate(graph, hw(), FixedCostModel(default_us=4.0), cfg)
    tracks = {s.op_id: s.track for s in res.timeline().spans}
    assert tracks == {0: "compute0", 1: "copy0", 2: "compute0"}
    assert res.makespan_us == 8.0


def test_engine_groups_are_validated() -> None:
    with pytest.raises(ValueError, match="exactly one compute group"):
        SimulationConfig(groups=(EngineGroup(name="a", kinds=("gemm",)),))
    with pytest.raises(ValueError, match="claimed"):
        SimulationConfig(
            groups=(
                EngineGroup(name="c"),
                EngineGroup(name="m1", role=EngineRole.COPY),
                EngineGroup(name="m2", role=EngineRole.COPY),
            )
        )
    with pytest.raises(ValueError):
        SimulationConfig.standard(0)
    cfg = SimulationConfig.model_validate_json(SimulationConfig.standard(3, copy_engines=2).model_dump_json())
    assert cfg.engines == 3 and cfg.with_engines(5).engines == 5


def test_uncosted_ops_fail_by_default_and_are_listed_when_skipped() -> None:
    graph = with_other(decoder_layers(1), 3)
    with pytest.raises(UncostedOpsError) as info:
        simulate(graph, hw(), PerOpCost(), SimulationConfig.standard(1))
    msg = info.value.one_line()
    assert "3 op(s) cannot be costed" in msg and "other×3" in msg and "no formula for mystery0" in msg
    assert "\n" not in msg
    res = simulate(graph, hw(), PerOpCost(), SimulationConfig.standard(1, skip_uncosted=True))
    st = res.stats()
    assert [u.definition for u in st.uncosted] == ["mystery0", "mystery1", "mystery2"]
    assert st.skipped_uncosted
    assert any("uncosted" in n for n in res.timeline().notes)
    assert not {s.op_id for s in res.timeline().spans} & {u.op_id for u in st.uncosted}


def test_cycle_is_a_typed_error() -> None:
    graph, durations = chain_graph([1.0, 1.0, 1.0])
    cyclic = graph.model_copy(update={"edges": (*graph.edges, Edge(src=2, dst=0))})
    with pytest.raises(CycleError, match="cycle 0 -> 1 -> 2 -> 0"):
        SchedulingProblem.from_durations(cyclic, durations)


def test_policy_registry() -> None:
    assert {"earliest", "critical-path", "stream"} <= set(POLICIES.names())
    with pytest.raises(RegistryError, match="already registered"):
        POLICIES.register("earliest", type(get_policy("earliest")))
    with pytest.raises(RegistryError, match="unknown scheduling policy 'nope'"):
        get_policy("nope")
    with pytest.raises(RegistryError, match="not a scheduling policy"):
        get_policy("opgraph.ir:OpGraph")
    # A user policy by module:Class: longest op first.
    assert isinstance(get_policy("sim_policies:LongestFirst"), SchedulingPolicy)
    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(3))
    problem = SchedulingProblem.from_durations(OpGraph(ops=ops), {0: 1.0, 1: 3.0, 2: 2.0})
    res = run_problem(problem, SimulationConfig.standard(1, policy="sim_policies:LongestFirst"))
    order = [s.op_id for s in res.timeline().spans]
    assert order == [1, 2, 0]


def test_timeline_and_stats_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from opgraph.ir import load_timeline, save_model, save_timeline

    res = simulate(decoder_layers(2), hw(), PerOpCost(), SimulationConfig.standard(2))
    tl = res.timeline()
    assert tl.source.kind.value == "simulated" and tl.source.config["engines.compute"] == 2
    assert tl.source.config["cost_model"] == "PerOpCost" and tl.source.device == "testdev"
    assert Timeline.model_validate_json(tl.model_dump_json()) == tl
    loaded = load_timeline(save_timeline(tl, tmp_path / "sim.json.gz"))
    assert loaded.spans == tl.spans
    span = next(s for s in tl.spans if s.kind is not None and s.kind.value == "gemm" and s.category is None)
    assert span.bound == "compute" and span.layer is not None and span.definition and span.stage is not None
    st = res.stats()
    assert SimulationStats.model_validate_json(save_model(st, tmp_path / "st.json").read_text()) == st
    assert sum(r.busy_us for r in st.by_kind.values()) == pytest.approx(st.serial_us)
    assert set(st.by_layer) == {"0", "1"}
    assert sum(e.busy_us for e in st.engines) == pytest.approx(st.serial_us)
    assert math.isclose(sum(r.share for r in st.by_kind.values()), 1.0)


def test_progress_is_reported() -> None:
    graph, durations = chain_graph([1.0] * 50)
    seen: list[tuple[int, int]] = []
    run_problem(SchedulingProblem.from_durations(graph, durations), progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1] == (50, 50)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_costs_are_computed_once_per_unique_configuration() -> None:
    from opgraph.ir import AtenCall, Gemm

    calls: list[int] = []

    class Counting(FixedCostModel):
        def estimate(self, op, hw_):  # type: ignore[no-untyped-def]
            calls.append(op.id)
            return super().estimate(op, hw_)

    call = AtenCall(args=({"tensor": 0}, {"tensor": 1}), keywords={"alpha": 1})
    ops = (
        Gemm(id=0, m=4, n=8, k=8, layer=0, scope="a"),
        Gemm(id=1, m=4, n=8, k=8, layer=1, scope="b"),  # equal but for layer and scope
        Gemm(id=2, m=4, n=8, k=16),
        Gemm(id=3, m=4, n=8, k=8, call=call),  # an unhashable field: keyed by JSON
        Gemm(id=4, m=4, n=8, k=8, call=call),
    )
    report = cost_graph(OpGraph(ops=ops), Counting(default_us=1.0), hw())
    assert report.unique_configs == 3 and calls == [0, 2, 3]
    assert set(report.costs) == {0, 1, 2, 3, 4}


def test_a_simulator_runs_again_from_time_zero() -> None:
    # A second run() once started at the first run's end time and returned a shifted makespan.
    problem, _, _ = cost_problem(decoder_layers(2), PerOpCost(), hw())
    config = SimulationConfig.standard(2, host=HostConfig(mode=HostMode.EAGER))
    sim = Simulator(problem, config, get_policy(config.policy), [1.0] * len(problem))
    first = sim.run()
    second = sim.run()
    assert second.makespan_us == first.makespan_us
    assert second.ranks[0].start_us == first.ranks[0].start_us
    assert min(s for s in second.ranks[0].start_us if s >= 0) == 1.0  # after the first op's host time


def test_the_kernel_reads_no_private_simpy_fields() -> None:
    # env._now and ev._value were read directly; SimPy can rename its private fields at any time.
    import ast
    import inspect

    import simpy

    import simulators.kernel

    env = simpy.Environment()

    def proc() -> Generator[simpy.Event, object, None]:
        yield env.timeout(0)

    objects = (env, env.event(), env.timeout(0), env.process(proc()), simpy.Interrupt(None))
    private = {a for o in objects for a in vars(o) if a.startswith("_") and not a.startswith("__")}
    assert "_now" in private and "_value" in private
    tree = ast.parse(inspect.getsource(simulators.kernel))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & private
