"""Scheduling invariants on random DAGs (hypothesis)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.ir import Edge, Elementwise, OpGraph, View
from simulators import HostConfig, HostMode, SchedulingProblem, SimulationConfig, SimulationResult, run_problem

POLICIES = ["earliest", "critical-path", "stream"]
EPS = 1e-6


@st.composite
def dags(draw: st.DrawFn) -> tuple[OpGraph, dict[int, float]]:
    """A random DAG (edges from lower to higher program index, shuffled ids) with durations."""
    n = draw(st.integers(1, 24))
    ops = []
    for i in range(n):
        free = draw(st.integers(0, 9)) == 0
        ops.append(View(id=i) if free else Elementwise(id=i, fn="add", numel=8))
    edges = []
    for j in range(1, n):
        for src in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            edges.append(Edge(src=src, dst=j))
    durations = {i: draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 7.0, 10.0])) for i in range(n)}
    return OpGraph(ops=tuple(ops), edges=tuple(edges)), durations


def _run(
    graph: OpGraph, durations: dict[int, float], engines: int, policy: str, host_us: float, seed: int = 0
) -> tuple[SchedulingProblem, SimulationResult]:
    problem = SchedulingProblem.from_durations(graph, durations)
    config = SimulationConfig.standard(
        engines, policy=policy, seed=seed, host=HostConfig(mode=HostMode.EAGER, per_op_us=host_us)
    )
    return problem, run_problem(problem, config)


@settings(max_examples=60, deadline=None)
@given(dags(), st.integers(1, 4), st.sampled_from(POLICIES), st.sampled_from([0.0, 0.7, 3.0]))
def test_schedule_is_feasible(
    case: tuple[OpGraph, dict[int, float]], engines: int, policy: str, host_us: float
) -> None:
    graph, durations = case
    problem, result = _run(graph, durations, engines, policy, host_us)
    tl = result.timeline()
    device = [s for s in tl.spans if s.category != "host"]
    # Every op with an engine has exactly one span; free ops none.
    assert sorted(s.op_id for s in device if s.op_id is not None) == [
        op.id for i, op in enumerate(graph.ops) if not problem.free[i]
    ]
    # No two spans overlap on one engine.
    by_track: dict[str, list[tuple[float, float]]] = {}
    for s in device:
        by_track.setdefault(s.track, []).append((s.start_us, s.end_us))
    for ivs in by_track.values():
        ivs.sort()
        for (_, e0), (s1, _) in itertools.pairwise(ivs):
            assert s1 >= e0 - EPS
    # No op starts before its predecessors end (free ops included, through the raw record).
    rec = result.kernel.ranks[0]
    for e in graph.edges:
        assert rec.start_us[e.dst] >= rec.start_us[e.src] + rec.dur_us[e.src] - EPS
    # Host: no op starts before the host issued it; issue times follow program order.
    assert all(rec.start_us[i] >= rec.issue_us[i] - EPS for i in range(len(graph.ops)))
    assert all(a <= b + EPS for a, b in zip(rec.issue_us, rec.issue_us[1:], strict=False))
    # Bounds: at least the critical path; with no host cost at most the serial sum.
    stats = result.stats()
    assert stats.makespan_us >= stats.critical_path.length_us - EPS
    if host_us == 0:
        assert stats.makespan_us <= problem.serial_us + EPS
    # Engine count and the stream policy's single engine.
    tracks = {s.track for s in device}
    assert len(tracks) <= (1 if policy == "stream" else engines)


@settings(max_examples=40, deadline=None)
@given(dags(), st.sampled_from(POLICIES))
def test_one_engine_no_host_is_serial_sum(case: tuple[OpGraph, dict[int, float]], policy: str) -> None:
    graph, durations = case
    problem, result = _run(graph, durations, 1, policy, 0.0)
    assert math.isclose(result.makespan_us, problem.serial_us, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=30, deadline=None)
@given(dags(), st.integers(1, 4), st.sampled_from(POLICIES), st.integers(0, 3))
def test_same_inputs_same_timeline(
    case: tuple[OpGraph, dict[int, float]], engines: int, policy: str, seed: int
) -> None:
    graph, durations = case
    problem = SchedulingProblem.from_durations(graph, durations)
    config = SimulationConfig.standard(engines, policy=policy, seed=seed, jitter=0.3, tp=2)
    a = run_problem(problem, config).timeline().model_dump_json()
    b = run_problem(problem, config).timeline().model_dump_json()
    assert a == b


@settings(max_examples=30, deadline=None)
@given(dags())
def test_stream_runs_in_program_order(case: tuple[OpGraph, dict[int, float]]) -> None:
    graph, durations = case
    problem, result = _run(graph, durations, 3, "stream", 0.5)
    rec = result.kernel.ranks[0]
    starts = [rec.start_us[i] for i in range(len(graph.ops)) if not problem.free[i]]
    assert starts == sorted(starts)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 500.0), min_size=2, max_size=12),
    st.lists(st.floats(0.0, 1000.0), min_size=12, max_size=12),
    st.floats(0.0, 50.0),
)
def test_every_op_runs_whatever_the_float_rounding_of_issue_times(
    durations: list[float], framework: list[float], host_us: float
) -> None:
    # Issue times are running sums of host times; an op whose predecessor ends before its issue
    # time waits for a timer at now + (issue - now), which rounding can put a hair before the issue
    # time. It must still run (it once deadlocked the Qwen3 simulation).
    n = len(durations)
    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(n))
    graph = OpGraph(ops=ops, edges=tuple(Edge(src=i, dst=i + 1) for i in range(n - 1)))
    problem = SchedulingProblem.from_durations(graph, dict(enumerate(durations)))
    problem.framework_us = framework[:n]
    config = SimulationConfig.standard(1, policy="stream", host=HostConfig(mode=HostMode.EAGER, per_op_us=host_us))
    rec = run_problem(problem, config).kernel.ranks[0]
    assert all(s >= i - EPS for s, i in zip(rec.start_us, rec.issue_us, strict=True))
    assert rec.start_us[-1] + durations[-1] >= sum(framework[:n]) + n * host_us - EPS * n
