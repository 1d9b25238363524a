"""How the host issues an op: :class:`HostIssue`, the ``issue`` field of every op.

Most ops are Python-level aten calls: the framework's Python runs before each (:attr:`HostIssue.CALL`).
Two kinds are not:

- :attr:`HostIssue.NESTED`: C++ issues the op inside the Python-level call before it (torch's fallback of
  ``_grouped_mm`` for fp16/fp32 runs one ``mm`` per expert from one call), so no framework Python runs
  before it;
- :attr:`HostIssue.SYNC`: a Python-level call that waits for the device before it launches (it first
  copies device data to the host, as that fallback copies its offsets): an eager host waits there for
  what it issued before.

Capture (:mod:`opgraph.capture.lowering.moe`) fills the field; the host model (:mod:`hardware.hostprofile`)
and the simulator read it through :func:`is_nested` and :func:`host_syncs`. Capture also ends such an op's
``definition`` with :data:`NESTED_MARK` or :data:`SYNC_MARK` (names users see, and keys of tables), but
nothing reads the marks except :func:`legacy_issue`, for ops saved before the field existed.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opgraph.ir.graph import OpGraph
    from opgraph.ir.ops import OpBase


class HostIssue(str, Enum):
    """How the host issues an op."""

    CALL = "call"
    """A Python-level aten call: the framework's Python runs before it."""
    NESTED = "nested"
    """Issued from C++ inside the Python-level call before it: no framework Python before it."""
    SYNC = "sync"
    """A Python-level call that waits for the device (for the ops issued before it) before it launches."""


NESTED_MARK = "@nested"
"""Ends the ``definition`` capture gives a :attr:`HostIssue.NESTED` op."""
SYNC_MARK = "@sync"
"""Ends the ``definition`` capture gives a :attr:`HostIssue.SYNC` op."""


def legacy_issue(definition: str) -> HostIssue:
    """The :class:`HostIssue` a definition's mark says: the legacy path, for ops saved or built before the
    ``issue`` field existed (read once, where an op is validated without the field).

    >>> legacy_issue("moe_grouped_mm_e8_h8_i4_topk2_down@nested").value, legacy_issue("gemm_n8_k8").value
    ('nested', 'call')
    """
    if definition.endswith(NESTED_MARK):
        return HostIssue.NESTED
    if definition.endswith(SYNC_MARK):
        return HostIssue.SYNC
    return HostIssue.CALL


def is_nested(op: OpBase) -> bool:
    """Whether ``op`` runs nested inside the Python-level aten call issued before it.

    >>> from opgraph.ir import Gemm
    >>> is_nested(Gemm(id=0, m=8, n=8, k=8, definition="moe_experts_down", issue=HostIssue.NESTED))
    True
    """
    return op.issue is HostIssue.NESTED


def host_syncs(graph: OpGraph) -> tuple[int, ...]:
    """Ids of the ops of ``graph`` that wait for the device before they launch (:attr:`HostIssue.SYNC`),
    in program order: a simulation's eager host waits after the op before each (its ``sync_ops``).

    >>> from opgraph.ir import Gemm, OpGraph
    >>> host_syncs(OpGraph(ops=(Gemm(id=3, m=8, n=8, k=8, issue=HostIssue.SYNC),)))
    (3,)
    """
    return tuple(op.id for op in graph.ops if op.issue is HostIssue.SYNC)
