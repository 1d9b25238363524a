"""Graph algorithms over :class:`~opgraph.ir.OpGraph`, as free functions in the manner of networkx.

Two layers, one implementation:

- **Array functions** work on program indices (op ``i`` is ``graph.ops[i]``): :func:`adjacency`
  builds successor lists and in-degrees once, and :func:`generations`, :func:`longest_path`,
  :func:`bottom_levels` and :func:`index_cycle` walk them. The simulator keeps these arrays and
  calls them directly; they do no per-op allocation beyond lists of ints and floats.
- **Graph functions** (:func:`topological_order`, :func:`topological_generations`,
  :func:`critical_path`, :func:`parallelism_profile`, :func:`find_cycle`) take a graph and speak
  in op ids; each is a thin wrapper over the array functions.

All run in O(V + E) (generations sort each level: O(V log V) at worst); none needs networkx. A
cyclic graph raises :class:`~opgraph.ir.errors.CycleError` naming one cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from opgraph.ir.errors import CycleError
from opgraph.ir.ops import OpBase


class EdgeLike(Protocol):
    """What the algorithms read of an edge."""

    @property
    def src(self) -> int:
        """Id of the producing op."""
        ...

    @property
    def dst(self) -> int:
        """Id of the consuming op."""
        ...


class GraphLike(Protocol):
    """What the algorithms read of a graph: its ops in program order and its edges (an ``OpGraph``)."""

    @property
    def ops(self) -> Sequence[OpBase]:
        """Ops in program order."""
        ...

    @property
    def edges(self) -> Sequence[EdgeLike]:
        """Dependencies by op id."""
        ...


# ---------------------------------------------------------------------------------------------------
# Array functions (program indices)


def adjacency(ops: Sequence[OpBase], edges: Sequence[EdgeLike]) -> tuple[list[list[int]], list[int]]:
    """Successor lists and in-degrees by program index: ``succ[i]`` are the indices that wait for op ``i``.

    A repeated edge counts once; an edge naming an op that is not in ``ops`` is skipped (``lint``
    reports those). Raises :class:`CycleError` on a self-loop.

    Examples
    --------
    >>> from opgraph.ir import Edge, Elementwise
    >>> ops = [Elementwise(id=i, fn="add", numel=4) for i in (10, 11, 12)]
    >>> adjacency(ops, [Edge(src=10, dst=12), Edge(src=11, dst=12), Edge(src=10, dst=12)])
    ([[2], [2], []], [0, 0, 2])
    """
    n = len(ops)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    seen: set[int] = set()
    seen_add = seen.add
    if all(op.id == i for i, op in enumerate(ops)):  # ids are indices: no lookup (captured graphs)
        pairs = ((e.src, e.dst) for e in edges if e.src < n and e.dst < n)
    else:
        get = {op.id: i for i, op in enumerate(ops)}.get
        mapped = ((get(e.src), get(e.dst)) for e in edges)
        pairs = ((s, d) for s, d in mapped if s is not None and d is not None)
    for s, d in pairs:
        pair = s * n + d
        if pair in seen:
            continue
        seen_add(pair)
        if s == d:
            raise CycleError(f"op {ops[s].id} depends on itself", where="edges", hint="remove this edge")
        succ[s].append(d)
        indeg[d] += 1
    return succ, indeg


def generations(
    succ: Sequence[Sequence[int]], indeg: Sequence[int], ids: Sequence[int] | None = None
) -> list[list[int]]:
    """Kahn's layers by program index: each layer depends only on earlier ones, sorted by index.

    ``ids`` (op ids by index) name the ops of a cycle in the :class:`CycleError`.

    Examples
    --------
    >>> generations([[2], [2], []], [0, 0, 2])
    [[0, 1], [2]]
    >>> generations([[1], [0]], [1, 1], ids=[7, 8])
    Traceback (most recent call last):
    ...
    opgraph.ir.errors.CycleError: edges: dependency cycle 7 -> 8 -> 7 (remove one of these edges)
    """
    deg = list(indeg)
    current = [i for i, d in enumerate(deg) if d == 0]
    out: list[list[int]] = []
    done = 0
    while current:
        out.append(current)
        done += len(current)
        nxt: list[int] = []
        append = nxt.append
        for u in current:
            for v in succ[u]:
                c = deg[v] - 1
                deg[v] = c
                if c == 0:
                    append(v)
        nxt.sort()
        current = nxt
    if done != len(deg):
        raise _cycle_error(index_cycle(succ), ids)
    return out


def index_cycle(succ: Sequence[Sequence[int]]) -> list[int]:
    """Program indices on one dependency cycle, or ``[]`` for a DAG (iterative depth-first search).

    Examples
    --------
    >>> index_cycle([[1], [2], [0]])
    [0, 1, 2]
    >>> index_cycle([[1], []])
    []
    """
    white, grey, black = 0, 1, 2
    color = [white] * len(succ)
    for root in range(len(succ)):
        if color[root] != white:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[int] = [root]
        color[root] = grey
        while stack:
            node, i = stack[-1]
            nxt = succ[node]
            if i < len(nxt):
                stack[-1] = (node, i + 1)
                child = nxt[i]
                if color[child] == grey:
                    return path[path.index(child) :]
                if color[child] == white:
                    color[child] = grey
                    stack.append((child, 0))
                    path.append(child)
            else:
                color[node] = black
                stack.pop()
                path.pop()
    return []


def longest_path(
    succ: Sequence[Sequence[int]], order: Sequence[int], weight: Sequence[float]
) -> tuple[float, list[int]]:
    """Length and program indices of the heaviest chain of dependent ops, first to last.

    ``order`` is a topological order of ``succ``; ``weight`` the time of each op. Among equally
    heavy chains the one met first in ``order`` wins.

    Examples
    --------
    >>> longest_path([[2], [2], []], [0, 1, 2], [1.0, 5.0, 2.0])
    (7.0, [1, 2])
    """
    n = len(weight)
    if n == 0:
        return 0.0, []
    start = [0.0] * n
    pred = [-1] * n
    end_best, end_at = -1.0, 0
    for i in order:
        f = start[i] + weight[i]
        if f > end_best:
            end_best, end_at = f, i
        for j in succ[i]:
            if pred[j] < 0 or f > start[j]:
                start[j] = f
                pred[j] = i
    path = [end_at]
    while pred[path[-1]] >= 0:
        path.append(pred[path[-1]])
    path.reverse()
    return end_best, path


def bottom_levels(succ: Sequence[Sequence[int]], order: Sequence[int], weight: Sequence[float]) -> list[float]:
    """Longest time from each op's start to the end of the graph, its own ``weight`` included.

    Examples
    --------
    >>> bottom_levels([[2], [2], []], [0, 1, 2], [1.0, 5.0, 2.0])
    [3.0, 7.0, 2.0]
    """
    bl = [0.0] * len(weight)
    for i in reversed(order):  # every successor's level is known before its predecessors'
        best = 0.0
        for j in succ[i]:
            v = bl[j]
            if v > best:
                best = v
        bl[i] = weight[i] + best
    return bl


def _cycle_error(cycle: list[int], ids: Sequence[int] | None) -> CycleError:
    names = [ids[i] for i in cycle] if ids is not None else cycle
    path = " -> ".join(str(i) for i in [*names, names[0]]) if names else "?"
    return CycleError(f"dependency cycle {path}", where="edges", hint="remove one of these edges")


# ---------------------------------------------------------------------------------------------------
# Graph functions (op ids)


def find_cycle(ops: Sequence[OpBase], edges: Sequence[EdgeLike]) -> list[int]:
    """Op ids on one dependency cycle, or ``[]`` when the edges form a DAG.

    Examples
    --------
    >>> from opgraph.ir import Edge, Elementwise
    >>> ops = [Elementwise(id=i, fn="add", numel=4) for i in range(3)]
    >>> find_cycle(ops, [Edge(src=0, dst=1), Edge(src=1, dst=2), Edge(src=2, dst=1)])
    [1, 2]
    """
    n = len(ops)
    index = {op.id: i for i, op in enumerate(ops)}
    succ: list[list[int]] = [[] for _ in range(n)]
    for e in edges:
        s, d = index.get(e.src), index.get(e.dst)
        if s is not None and d is not None:
            succ[s].append(d)
    return [ops[i].id for i in index_cycle(succ)]


def topological_order(graph: GraphLike) -> list[int]:
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


def topological_generations(graph: GraphLike) -> list[list[int]]:
    """Op ids grouped into generations: each generation depends only on earlier ones (Kahn layers).

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> ops = tuple(Elementwise(id=i, fn="add", numel=4) for i in range(3))
    >>> topological_generations(OpGraph(ops=ops, edges=(Edge(src=0, dst=2), Edge(src=1, dst=2))))
    [[0, 1], [2]]
    """
    ids = [op.id for op in graph.ops]
    succ, indeg = adjacency(graph.ops, graph.edges)
    return [[ids[i] for i in gen] for gen in generations(succ, indeg, ids)]


@dataclass(frozen=True)
class CriticalPath:
    """The longest weighted chain of dependent ops."""

    length: float
    """Sum of the durations along the path."""
    ops: tuple[int, ...]
    """Op ids along the path, first to last."""


def critical_path(
    graph: GraphLike, duration: Mapping[int, float] | Callable[[OpBase], float] | None = None
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
    ops = graph.ops
    if duration is None:
        weight = [float(o.flops) for o in ops]
    elif callable(duration):
        weight = [float(duration(o)) for o in ops]
    else:
        weight = [float(duration.get(o.id, 0.0)) for o in ops]
    ids = [op.id for op in ops]
    succ, indeg = adjacency(ops, graph.edges)
    order = [i for gen in generations(succ, indeg, ids) for i in gen]
    length, path = longest_path(succ, order, weight)
    return CriticalPath(length if path else 0.0, tuple(ids[i] for i in path))


def parallelism_profile(graph: GraphLike) -> list[int]:
    """Width of each topological generation: how many ops could run at once at each depth.

    Examples
    --------
    >>> from opgraph.ir import OpGraph, Edge, Elementwise
    >>> ops = tuple(Elementwise(id=i, fn="add", numel=4) for i in range(4))
    >>> parallelism_profile(OpGraph(ops=ops, edges=(Edge(src=0, dst=1), Edge(src=0, dst=2), Edge(src=0, dst=3))))
    [1, 3]
    """
    return [len(g) for g in topological_generations(graph)]
