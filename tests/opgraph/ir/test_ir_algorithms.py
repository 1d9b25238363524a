"""The graph algorithms (one implementation for the IR and the simulator) against networkx."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.ir import CycleError, Edge, Elementwise, OpGraph, critical_path, topological_generations
from opgraph.ir.algorithms import (
    adjacency,
    bottom_levels,
    find_cycle,
    generations,
    index_cycle,
    longest_path,
)
from simulators import SchedulingProblem


@st.composite
def dags(draw: st.DrawFn) -> tuple[OpGraph, dict[int, float]]:
    """A random DAG with shuffled op ids (ids are not program indices) and op weights."""
    n = draw(st.integers(1, 30))
    ids = draw(st.permutations(range(100, 100 + n)))
    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in ids)
    edges = [
        Edge(src=ids[s], dst=ids[j]) for j in range(1, n) for s in draw(st.lists(st.integers(0, j - 1), max_size=3))
    ]
    weight = {i: draw(st.sampled_from([0.0, 1.0, 2.5, 4.0, 9.0])) for i in ids}
    return OpGraph(ops=ops, edges=tuple(edges)), weight


def to_networkx(graph: OpGraph) -> nx.DiGraph:
    g: nx.DiGraph = nx.DiGraph()
    g.add_nodes_from(op.id for op in graph.ops)
    g.add_edges_from((e.src, e.dst) for e in graph.edges)
    return g


@settings(max_examples=120, deadline=None)
@given(dags())
def test_generations_and_critical_path_match_networkx(case: tuple[OpGraph, dict[int, float]]) -> None:
    graph, weight = case
    ref = to_networkx(graph)
    position = {op.id: i for i, op in enumerate(graph.ops)}
    want_gens = [sorted(gen, key=position.__getitem__) for gen in nx.topological_generations(ref)]
    assert topological_generations(graph) == want_gens
    # Longest path by node weight: networkx weighs edges, so weigh each edge by its source and
    # add the last node's own weight.
    for u, v in ref.edges:
        ref.edges[u, v]["w"] = weight[u]
    best = max(
        (nx.dag_longest_path_length(nx.subgraph(ref, nx.ancestors(ref, t) | {t}), weight="w") + weight[t] for t in ref),
        default=0.0,
    )
    cp = critical_path(graph, weight)
    assert cp.length == pytest.approx(best)
    assert sum(weight[i] for i in cp.ops) == pytest.approx(cp.length)
    assert all(ref.has_edge(a, b) for a, b in itertools.pairwise(cp.ops))


@settings(max_examples=80, deadline=None)
@given(dags())
def test_the_simulator_uses_the_same_order_and_critical_path(case: tuple[OpGraph, dict[int, float]]) -> None:
    graph, weight = case
    problem = SchedulingProblem.from_durations(graph, weight)
    ids = [op.id for op in graph.ops]
    assert [ids[i] for i in problem.topo] == [i for gen in topological_generations(graph) for i in gen]
    length, path = problem.critical_path()
    cp = critical_path(graph, weight)
    assert (length, tuple(ids[i] for i in path)) == (cp.length, cp.ops)
    # Bottom levels: each op's weight plus the heaviest chain after it (brute force over successors).
    succ, _ = adjacency(graph.ops, graph.edges)
    levels = bottom_levels(succ, problem.topo, problem.dur_us)
    for i in reversed(problem.topo):
        assert levels[i] == pytest.approx(problem.dur_us[i] + max((levels[j] for j in succ[i]), default=0.0))


@settings(max_examples=80, deadline=None)
@given(dags(), st.data())
def test_a_back_edge_makes_a_cycle_that_is_found(case: tuple[OpGraph, dict[int, float]], data: st.DataObject) -> None:
    graph, _ = case
    ref = to_networkx(graph)
    pairs = [(u, v) for u in ref for v in nx.descendants(ref, u)]
    if not pairs:
        assert find_cycle(graph.ops, graph.edges) == []
        return
    u, v = data.draw(st.sampled_from(pairs))
    cyclic = graph.model_copy(update={"edges": (*graph.edges, Edge(src=v, dst=u))})
    cycle = find_cycle(cyclic.ops, cyclic.edges)
    closed = [*cycle, cycle[0]]
    assert all(to_networkx(cyclic).has_edge(a, b) for a, b in itertools.pairwise(closed))
    with pytest.raises(CycleError, match="dependency cycle"):
        topological_generations(cyclic)
    with pytest.raises(CycleError, match="dependency cycle"):
        SchedulingProblem.from_durations(cyclic, dict.fromkeys((op.id for op in cyclic.ops), 1.0))


def test_array_functions_on_indices() -> None:
    succ = [[1, 2], [3], [3], []]
    assert generations(succ, [0, 1, 1, 2]) == [[0], [1, 2], [3]]
    assert longest_path(succ, [0, 1, 2, 3], [1.0, 2.0, 3.0, 1.0]) == (5.0, [0, 2, 3])
    assert index_cycle([[1], [2], [1]]) == [1, 2]
    with pytest.raises(CycleError, match="op 5 depends on itself"):
        adjacency([Elementwise(id=5, fn="add", numel=1)], [Edge(src=5, dst=5)])
