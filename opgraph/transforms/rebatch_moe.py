"""Where the experts calls of a rebatch template are, and how many rows each expert gets at a new shape.

A captured experts call (:mod:`opgraph.capture.lowering.moe`) is a ``dispatch`` routing step, the
expert GEMMs and the ops between them, and a ``combine``. Its expert GEMMs are of one of three
forms, told apart by their tensors, never by the value of a row count:

- ``grouped``: one grouped GEMM per projection (a stacked ``[experts, k, n]`` weight): its ``m`` is the
  mean rows of the experts that receive tokens, ``groups`` their number;
- ``expert``: one GEMM per expert that receives tokens, at its own rows (torch's per-expert fallback
  for dtypes without a grouped kernel, or the eager loop), the ``j``-th of each projection being the
  ``j``-th busiest expert; the ops on one expert's rows only (the eager loop's activation) and the
  combine's per-expert inputs belong to that expert too;
- ``batched``: ``batched_mm``'s per-pair weights (every tensor sized by the token-expert pairs).

The other ops of the call work on all token-expert pairs (``pairs``). Rows per expert are not
template sizes: they are re-derived for the new token count by the capture's own routing model
(:func:`opgraph.capture.moe_model.expert_counts`, balanced or with the template's ``moe_skew``), so a
rebatch and a fresh capture route alike. A template whose routing was observed on a device is
rebatched with balanced routing.

>>> from opgraph.ir import Gemm, MoeRouting, OpGraph
>>> route = {"tokens": 4, "experts": 4, "top_k": 2}
>>> ops = (
...     MoeRouting(id=0, fn="dispatch", **route),
...     Gemm(id=1, target="moe_experts_up", m=5, n=32, k=16),
...     Gemm(id=2, target="moe_experts_up", m=3, n=32, k=16),
...     MoeRouting(id=3, fn="combine", **route),
... )
>>> layout = moe_layout(OpGraph(ops=ops, edges=()))
>>> layout.sections[0].expert_rows, layout.role[2], layout.expert[2], routed_rows(layout.sections[0], 2, 0.0)
((5, 3), 'expert', 1, [2, 1, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal, TypeVar

from opgraph.ir.experts import ExpertsImpl
from opgraph.ir.graph import OpGraph
from opgraph.ir.ops import Gemm, MoeRouting

__all__: list[str] = []

Role = Literal["routing", "grouped", "expert", "batched", "pairs"]


@dataclass(frozen=True)
class MoeSection:
    """One experts call of a template."""

    tokens: int
    """Tokens routed (the dispatch's ``tokens``)."""
    experts: int
    top_k: int
    expert_rows: tuple[int, ...] = ()
    """Rows of each expert that has its own GEMMs, busiest first (empty for a grouped call)."""
    layer: int = 0
    """The call's layer (its dispatch's ``layer``), over which balanced routing realises the expected
    active experts (:func:`opgraph.capture.moe_model.expected_active`)."""

    @property
    def pairs(self) -> int:
        """Token-expert pairs of the call."""
        return self.tokens * self.top_k


@dataclass(frozen=True)
class MoeLayout:
    """The experts calls of a graph, by op index."""

    sections: tuple[MoeSection, ...] = ()
    section_of: Mapping[int, int] = field(default_factory=dict)
    """Op index (dispatch to combine, both included) -> its section."""
    role: Mapping[int, Role] = field(default_factory=dict)
    """Op index -> what the op is within its call."""
    expert: Mapping[int, int] = field(default_factory=dict)
    """Op index of an ``expert`` op -> the expert it belongs to (0 is the busiest)."""
    rows_in: Mapping[int, tuple[int | None, ...]] = field(default_factory=dict)
    """Op index -> for each input, the expert whose rows its first dimension counts (``None``: not per expert)."""
    rows_out: Mapping[int, tuple[int | None, ...]] = field(default_factory=dict)
    """The same for the outputs."""


def _is_stacked(op: Gemm) -> bool:
    return any(len(t.shape) == 3 for t in op.inputs)


def _build(graph: OpGraph) -> MoeLayout:
    sections: list[MoeSection] = []
    section_of: dict[int, int] = {}
    role: dict[int, Role] = {}
    expert: dict[int, int] = {}
    rows_in: dict[int, tuple[int | None, ...]] = {}
    rows_out: dict[int, tuple[int | None, ...]] = {}
    cur: MoeRouting | None = None
    rows: list[int] = []
    families: dict[str, int] = {}
    writer: dict[int, int] = {}  # tensor id -> the expert whose rows it holds

    def close() -> None:
        assert cur is not None
        sections.append(MoeSection(cur.tokens, cur.experts, cur.top_k, tuple(rows), cur.layer or 0))

    def owner(t_id: int | None, dim0: int | None, pairs: int) -> int | None:
        j = writer.get(t_id) if t_id is not None else None
        if j is None or dim0 is None or j >= len(rows) or dim0 != rows[j] or dim0 == pairs:
            return None
        return j

    for i, op in enumerate(graph.ops):
        if isinstance(op, MoeRouting) and op.fn == "dispatch":
            if cur is not None:  # a dispatch without a combine: close the open call first
                close()
            cur, rows, families, writer = op, [], {}, {}
            section_of[i], role[i] = len(sections), "routing"
            continue
        if cur is None:
            continue
        section_of[i] = len(sections)
        pairs = cur.tokens * cur.top_k
        if isinstance(op, MoeRouting):
            role[i] = "routing"
            rows_in[i] = tuple(owner(t.id, t.shape[0] if t.shape else None, pairs) for t in op.inputs)
            if op.fn == "combine":
                close()
                cur = None
            continue
        if isinstance(op, Gemm) and _is_stacked(op):
            role[i] = "batched" if op.expert is not None and op.expert.impl is ExpertsImpl.BATCHED_MM else "grouped"
            continue
        if isinstance(op, Gemm):
            family = op.target or f"{op.n}x{op.k}"
            j = families.get(family, 0)
            families[family] = j + 1
            if j == len(rows):
                rows.append(op.m)
            role[i], expert[i] = "expert", j
            two_d = [p for p, t in enumerate(op.inputs) if len(t.shape) == 2]
            weight = two_d[1] if len(two_d) > 1 else None  # (activation, weight, out=...) in call order
            rows_in[i] = tuple(
                j if p in two_d and p != weight and t.shape[0] == op.m else None for p, t in enumerate(op.inputs)
            )
            rows_out[i] = tuple(j if len(t.shape) == 2 and t.shape[0] == op.m else None for t in op.outputs)
            writer.update((t.id, j) for t in op.outputs if t.id is not None)
            continue
        ins = tuple(owner(t.id, t.shape[0] if t.shape else None, pairs) for t in op.inputs)
        owned = next((x for x in ins if x is not None), None)
        if owned is None:
            role[i] = "pairs"
            for t in op.outputs:
                if t.id is not None:
                    writer.pop(t.id, None)
            continue
        j = owned
        role[i], expert[i] = "expert", j
        rows_in[i] = tuple(j if t.shape and t.shape[0] == rows[j] else None for t in op.inputs)
        rows_out[i] = tuple(j if t.shape and t.shape[0] == rows[j] else None for t in op.outputs)
        writer.update((t.id, j) for t in op.outputs if t.id is not None)
    if cur is not None:
        close()
    return MoeLayout(tuple(sections), section_of, role, expert, rows_in, rows_out)


_T = TypeVar("_T")


def graph_memo(cache: dict[int, tuple[OpGraph, _T]], graph: OpGraph, build: Callable[[OpGraph], _T]) -> _T:
    """``build(graph)``, memoised in ``cache`` for the last few graphs (templates are rebatched many times)."""
    hit = cache.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    value = build(graph)
    if len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[id(graph)] = (graph, value)
    return value


_LAYOUT_CACHE: dict[int, tuple[OpGraph, MoeLayout]] = {}


def moe_layout(graph: OpGraph) -> MoeLayout:
    """The experts calls of ``graph`` (memoised)."""
    return graph_memo(_LAYOUT_CACHE, graph, _build)


def routed_rows(section: MoeSection, tokens: int, skew: float) -> list[int]:
    """Rows of each expert that receives tokens (busiest first) when ``tokens`` tokens go through
    ``section``, as a capture on meta routes them."""
    return list(_routed(tokens, section.experts, section.top_k, skew, section.layer))


@lru_cache(maxsize=256)
def _routed(tokens: int, experts: int, top_k: int, skew: float, layer: int) -> tuple[int, ...]:
    from opgraph.capture.moe_model import expert_counts

    return tuple(expert_counts(tokens * top_k, experts, tokens, skew, layer))


def tokens_reaching_all(experts: int, top_k: int, layers: int = 1) -> int:
    """The fewest tokens whose balanced routing reaches every expert in each of layers ``0..layers-1``
    (what a template of per-expert GEMMs needs to rebatch to any shape)."""
    from opgraph.capture.moe_model import expected_active

    def reach(tokens: int) -> bool:
        return all(expected_active(experts, tokens, top_k, layer) >= experts for layer in range(layers))

    lo, hi = 1, 1
    while not reach(hi):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if not reach(mid):
            lo = mid + 1
        else:
            hi = mid
    return hi
