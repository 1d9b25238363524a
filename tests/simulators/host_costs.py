"""A cost model whose costs are 'measured': they carry each op's host issue time, as a device
profile's or a calibrated table's do (the host tests' stand-in for the profile cost model)."""

from __future__ import annotations

import dataclasses

from sim_graphs import PerOpCost

from hardware.base import Cost
from hardware.spec import HardwareSpec
from opgraph.ir import OpBase

ISSUE_US = 1.0
"""The measured issue time of every op, microseconds."""


class MeasuredCost(PerOpCost):
    """:class:`PerOpCost` with an issue time of :data:`ISSUE_US` per op (a calibrated table's kind)."""


class ProfileModel(MeasuredCost):
    """Named as the device-profile cost model, whose runs take the device's shipped host profile."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        return dataclasses.replace(super().estimate(op, hw), host_s=ISSUE_US * 1e-6)
