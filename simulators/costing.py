"""A cost model of fixed times, for what-if studies and tests.

Costing a whole graph is :func:`hardware.base.cost_graph` (one costing loop for the project);
:func:`simulators.cost_problem` calls it with the collective model as the fallback.
"""

from __future__ import annotations

from collections.abc import Mapping

from hardware.base import Bound, Cost, UncostedOpError
from hardware.spec import HardwareSpec
from opgraph.ir import OpBase, OpKind


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
