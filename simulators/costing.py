"""Costing a graph for simulation: each unique op configuration once, collectives from the interconnect.

:func:`cost_ops` follows :func:`hardware.base.cost_graph` (same cache key, same
:func:`~hardware.base.estimate_op`) and costs collectives the model declines with the one
collective formula, :class:`hardware.models.collective.AlphaBetaCollectiveModel`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from hardware.base import (
    Bound,
    Cost,
    CostModel,
    GraphCosts,
    UncostedOpError,
    cost_key,
    estimate_op,
)
from hardware.models.collective import AlphaBetaCollectiveModel
from hardware.spec import HardwareSpec
from opgraph.ir import Collective, OpBase, OpGraph, OpKind


@dataclass
class CostReport:
    """Costs of a graph's ops plus how they were obtained."""

    costs: GraphCosts
    """Cost per op id; ops the model declined are in ``costs.uncosted`` with the reason."""
    unique_configs: int
    """Distinct op configurations the cost model was asked about."""
    from_interconnect: int
    """Collectives the model declined that were costed from the interconnect instead."""
    model_name: str
    """Class name of the cost model."""


def cost_ops(graph: OpGraph, model: CostModel, hw: HardwareSpec) -> CostReport:
    """Cost every op of ``graph`` with ``model`` on ``hw``, each unique configuration once.

    A collective the model declines is costed by :class:`AlphaBetaCollectiveModel` from
    ``hw.interconnect`` (the device link, else PCIe) when the spec has one. Other declined ops go
    to ``uncosted`` with their reason; a model that raises anything else, or returns a bad time,
    raises :class:`~hardware.base.CostModelError` naming the op.
    """
    name = type(model).__name__
    out = GraphCosts()
    memo: dict[Hashable, Cost | str] = {}
    from_link = 0
    link_model = AlphaBetaCollectiveModel()
    for op in graph.ops:
        key = cost_key(op)
        hit = memo.get(key)
        if hit is None:
            hit = estimate_op(model, op, hw, name)
            if isinstance(hit, str) and isinstance(op, Collective):
                fallback = estimate_op(link_model, op, hw, type(link_model).__name__)
                if isinstance(fallback, Cost):
                    hit = fallback
                    from_link += 1
            memo[key] = hit
        if isinstance(hit, Cost):
            out.costs[op.id] = hit
        else:
            out.uncosted[op.id] = hit
    return CostReport(costs=out, unique_configs=len(memo), from_interconnect=from_link, model_name=name)


class FixedCostModel:
    """A cost model of fixed times: per definition, per kind, or one default (what-if studies, tests).

    Views cost nothing (bound ``free``) unless given a time. Kinds with no time and no default
    are declined (:class:`~hardware.base.UncostedOpError`).

    Examples
    --------
    >>> from opgraph.ir import Elementwise
    >>> from hardware.spec import HardwareSpec
    >>> hw = HardwareSpec(name="x", memory_bytes=1e9, memory_bandwidth=1e12)
    >>> FixedCostModel(default_us=3.0).estimate(Elementwise(id=0, fn="add", numel=8), hw).us
    3.0
    """

    def __init__(
        self,
        default_us: float | None = None,
        *,
        by_kind: Mapping[OpKind | str, float] | None = None,
        by_definition: Mapping[str, float] | None = None,
    ) -> None:
        self.default_us = default_us
        self.by_kind = {OpKind(k): float(v) for k, v in (by_kind or {}).items()}
        self.by_definition = dict(by_definition or {})

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The fixed time of ``op``."""
        us = self.by_definition.get(op.definition)
        if us is None:
            us = self.by_kind.get(op.kind)
        if us is None:
            if op.kind is OpKind.VIEW:
                return Cost(seconds=0.0, bound=Bound.FREE)
            us = self.default_us
        if us is None:
            raise UncostedOpError(f"no fixed time for kind {op.kind.value!r}", where=f"op {op.id}")
        bound = Bound.LINK if op.kind is OpKind.COLLECTIVE else Bound.COMPUTE
        return Cost(seconds=us * 1e-6, bound=bound)
