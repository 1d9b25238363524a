"""OpGraph: lint, networkx view, and the graph algorithms against networkx."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import graphs

from opgraph.ir import (
    CycleError,
    DanglingEdgeError,
    DuplicateIdError,
    Edge,
    Elementwise,
    OpGraph,
    critical_path,
    parallelism_profile,
    topological_generations,
    topological_order,
)


def _ops(n: int) -> tuple[Elementwise, ...]:
    return tuple(Elementwise(id=i, fn="add", numel=8) for i in range(n))


def test_lint_duplicate_ids() -> None:
    g = OpGraph(ops=(Elementwise(id=1, fn="add", numel=1), Elementwise(id=1, fn="mul", numel=1)))
    with pytest.raises(DuplicateIdError, match="op id 1 is used by 2 ops"):
        g.lint()


def test_lint_dangling_edge_names_field() -> None:
    g = OpGraph(ops=_ops(2), edges=(Edge(src=0, dst=1), Edge(src=1, dst=9)))
    with pytest.raises(DanglingEdgeError) as info:
        g.lint()
    assert info.value.where == "edges.1.dst"


def test_lint_cycle_and_self_loop() -> None:
    with pytest.raises(CycleError, match="0 -> 1 -> 2 -> 0"):
        OpGraph(ops=_ops(3), edges=(Edge(src=0, dst=1), Edge(src=1, dst=2), Edge(src=2, dst=0))).lint()
    with pytest.raises(CycleError, match="self-loop"):
        OpGraph(ops=_ops(1), edges=(Edge(src=0, dst=0),)).lint()
    with pytest.raises(CycleError):
        topological_generations(OpGraph(ops=_ops(2), edges=(Edge(src=0, dst=1), Edge(src=1, dst=0))))


def test_summary_counts() -> None:
    g = OpGraph(ops=_ops(3), edges=(Edge(src=0, dst=1),))
    s = g.summary()
    assert s["ops"] == 3 and s["edges"] == 1 and s["flops"] == 24


@settings(max_examples=80, deadline=None)
@given(graphs())
def test_lint_accepts_generated_dags_and_networkx_agrees(g: OpGraph) -> None:
    g.lint()
    dg = g.to_networkx()
    assert dg.number_of_nodes() == len(g.ops)
    assert nx.is_directed_acyclic_graph(dg)
    order = topological_order(g)
    pos = {op_id: i for i, op_id in enumerate(order)}
    assert sorted(order) == sorted(o.id for o in g.ops)
    assert all(pos[e.src] < pos[e.dst] for e in g.edges)
    gens = topological_generations(g)
    assert [sorted(x) for x in gens] == [sorted(x) for x in nx.topological_generations(dg)]
    assert parallelism_profile(g) == [len(x) for x in gens]


@settings(max_examples=80, deadline=None)
@given(graphs(), st.randoms(use_true_random=False))
def test_critical_path_matches_networkx(g: OpGraph, rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    dur = {o.id: float(rnd.randint(0, 20)) for o in g.ops}
    cp = critical_path(g, dur)
    dg = g.to_networkx().copy()
    # networkx weighs edges; put each node's duration on a virtual sink edge by node splitting.
    split = nx.DiGraph()
    for n in dg.nodes:
        split.add_edge(("in", n), ("out", n), w=dur[n])
    for u, v in dg.edges:
        split.add_edge(("out", u), ("in", v), w=0.0)
    expected = nx.dag_longest_path_length(split, weight="w") if dur else 0.0
    assert cp.length == pytest.approx(expected)
    assert sum(dur[i] for i in cp.ops) == pytest.approx(cp.length)
    assert all(g.to_networkx().has_edge(a, b) for a, b in zip(cp.ops, cp.ops[1:], strict=False))
