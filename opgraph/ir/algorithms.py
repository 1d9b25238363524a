"""Graph algorithms over :class:`~opgraph.ir.OpGraph`, as free functions in the manner of networkx.

All run in O(V + E) on the graph's own edge lists (networkx is not needed) and raise
:class:`~opgraph.ir.errors.CycleError` on a cyclic graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from opgraph.ir.errors import CycleError
from opgraph.ir.graph import OpGraph
from opgraph.ir.ops import OpBase


def _adjacency(graph: OpGraph) -> tuple[list[int], dict[int, list[int]], dict[int, int]]:
    ids = [o.id for o in graph.ops]
    succ: dict[int, list[int]] = {i: [] for i in ids}
    indeg = dict.fromkeys(ids, 0)
    seen: set[tuple[int, int]] = set()
    for e in graph.edges:
        if (e.src, e.dst) in seen or e.src not in succ or e.dst not in succ:
            continue
        seen.add((e.src, e.dst))
        succ[e.src].append(e.dst)
        indeg[e.dst] += 1
    return ids, succ, indeg


def topological_order(graph: OpGraph) -> list[int]:
    """Op ids in a dependency-respecting order, ties broken by program order.

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> g = OpGraph(ops=(Elementwise(id=0, fn="add", numel=4), Elementwise(id=1, fn="mul", numel=4)),
    ...             edges=(Edge(src=1, dst=0),))
    >>> topological_order(g)
    [1, 0]
    """
    return [i for gen in topological_generations(graph) for i in gen]


def topological_generations(graph: OpGraph) -> list[list[int]]:
    """Ops grouped into generations: each generation depends only on earlier ones (Kahn layers).

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> ops = tuple(Elementwise(id=i, fn="add", numel=4) for i in range(3))
    >>> topological_generations(OpGraph(ops=ops, edges=(Edge(src=0, dst=2), Edge(src=1, dst=2))))
    [[0, 1], [2]]
    """
    ids, succ, indeg = _adjacency(graph)
    order = {i: n for n, i in enumerate(ids)}
    current = [i for i in ids if indeg[i] == 0]
    gens: list[list[int]] = []
    done = 0
    while current:
        gens.append(current)
        done += len(current)
        nxt: list[int] = []
        for u in current:
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    nxt.append(v)
        nxt.sort(key=order.__getitem__)
        current = nxt
    if done != len(ids):
        raise CycleError("the graph has a dependency cycle", where="edges", hint="run `lint()` to find it")
    return gens


@dataclass(frozen=True)
class CriticalPath:
    """The longest weighted chain of dependent ops."""

    length: float
    """Sum of the durations along the path."""
    ops: tuple[int, ...]
    """Op ids along the path, first to last."""


def critical_path(
    graph: OpGraph, duration: Mapping[int, float] | Callable[[OpBase], float] | None = None
) -> CriticalPath:
    """The longest path through the graph, weighting each op by ``duration``.

    ``duration`` is a mapping from op id to time, a function of the op, or ``None`` for FLOPs.
    Ops missing from a mapping weigh 0.

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> ops = tuple(Elementwise(id=i, fn="add", numel=4) for i in range(3))
    >>> g = OpGraph(ops=ops, edges=(Edge(src=0, dst=2), Edge(src=1, dst=2)))
    >>> critical_path(g, {0: 1.0, 1: 5.0, 2: 2.0})
    CriticalPath(length=7.0, ops=(1, 2))
    """
    if duration is None:
        weight: dict[int, float] = {o.id: float(o.flops) for o in graph.ops}
    elif callable(duration):
        weight = {o.id: float(duration(o)) for o in graph.ops}
    else:
        weight = {o.id: float(duration.get(o.id, 0.0)) for o in graph.ops}
    ids, succ, _ = _adjacency(graph)
    order = topological_order(graph)
    finish: dict[int, float] = {}
    best_pred: dict[int, int | None] = dict.fromkeys(ids, None)
    start = dict.fromkeys(ids, 0.0)
    for u in order:
        finish[u] = start[u] + weight[u]
        for v in succ[u]:
            if best_pred[v] is None or finish[u] > start[v]:
                start[v] = finish[u]
                best_pred[v] = u
    if not finish:
        return CriticalPath(0.0, ())
    end = max(finish, key=finish.__getitem__)
    path: list[int] = []
    cur: int | None = end
    while cur is not None:
        path.append(cur)
        cur = best_pred[cur]
    return CriticalPath(finish[end], tuple(reversed(path)))


def parallelism_profile(graph: OpGraph) -> list[int]:
    """Width of each topological generation: how many ops could run at once at each depth.

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> ops = tuple(Elementwise(id=i, fn="add", numel=4) for i in range(4))
    >>> parallelism_profile(OpGraph(ops=ops, edges=(Edge(src=0, dst=1), Edge(src=0, dst=2), Edge(src=0, dst=3))))
    [1, 3]
    """
    return [len(g) for g in topological_generations(graph)]
