"""Errors the simulator raises: all :class:`~opgraph.ir.OpgraphError`, one line each."""

from __future__ import annotations

from opgraph.ir import OpgraphError


class SimulationError(OpgraphError):
    """A simulation cannot run or did not finish (a deadlock, an impossible configuration)."""


class SimulationConfigError(SimulationError):
    """A simulation setting is out of range or contradicts another one."""


class UncostedOpsError(SimulationError):
    """The cost model declined some ops; they are listed (count, kinds, reasons), never counted as zero."""
