"""How the host issues an op, as capture marks it at the end of the op's ``definition``.

Most ops are Python-level aten calls: the framework's Python runs before each. Two marks say otherwise:

- :data:`NESTED_MARK`: C++ issues the op inside the Python-level call before it (torch's fallback of
  ``_grouped_mm`` for fp16/fp32 runs one ``mm`` per expert from one call), so no framework Python runs
  before it;
- :data:`SYNC_MARK`: the host waits for the device after the op (it copies device data to the host, as
  that fallback copies its offsets).

Capture (:mod:`opgraph.capture.lowering.moe`) writes the marks; the host model
(:mod:`hardware.hostprofile`) and the simulator read them through :func:`is_nested` and
:func:`host_syncs`.
"""

from __future__ import annotations

from opgraph.ir.graph import OpGraph
from opgraph.ir.ops import OpBase

NESTED_MARK = "@nested"
"""Ends the ``definition`` of an op that C++ issues inside the Python-level aten call before it."""
SYNC_MARK = "@sync"
"""Ends the ``definition`` of an op after which the host waits for the device."""


def is_nested(op: OpBase) -> bool:
    """Whether ``op`` runs nested inside the Python-level aten call issued before it (its definition
    ends with :data:`NESTED_MARK`).

    >>> from opgraph.ir import Gemm
    >>> is_nested(Gemm(id=0, m=8, n=8, k=8, definition="moe_grouped_mm_e8_h8_i4_topk2_down@nested"))
    True
    """
    return op.definition.endswith(NESTED_MARK)


def host_syncs(graph: OpGraph) -> tuple[int, ...]:
    """Ids of the ops of ``graph`` after which the host waits for the device (definitions ending with
    :data:`SYNC_MARK`), in program order: the ``sync_ops`` of a simulation's eager host.

    >>> from opgraph.ir import Gemm, OpGraph
    >>> host_syncs(OpGraph(ops=(Gemm(id=3, m=8, n=8, k=8, definition="moe_grouped_mm_e8_h8_i4_topk2_down@sync"),)))
    (3,)
    """
    return tuple(op.id for op in graph.ops if op.definition.endswith(SYNC_MARK))
