"""``softmax``: softmax and log-softmax over the last dimension."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, last_dim, numel
from opgraph.ir.ops import OpKind


@dataclass(frozen=True)
class LowerSoftmax:
    """``Softmax`` ops."""

    name: ClassVar[str] = "softmax"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if ev.fn in ("_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"):
                x = ev.inputs[0]
                cols = last_dim(x)
                lw.claim([ev.index], OpKind.SOFTMAX, {"rows": numel(x) // max(cols, 1), "cols": max(cols, 1)})
