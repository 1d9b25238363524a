"""``other``: what no pass recognised stays ``Other`` (with FLOPs when PyTorch's counter knows them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering
from opgraph.ir.ops import OpKind


@dataclass(frozen=True)
class KeepOther:
    """Every unclaimed event becomes one ``Other`` op."""

    name: ClassVar[str] = "other"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            lw.claim([ev.index], OpKind.OTHER, {"fn": ev.fn})
