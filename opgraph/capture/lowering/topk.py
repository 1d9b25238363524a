"""``topk``: top-k, argmax/argmin, sort and sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, last_dim, numel
from opgraph.ir.ops import OpKind

_FNS = frozenset({"topk", "argmax", "argmin", "sort", "argsort", "multinomial"})


@dataclass(frozen=True)
class LowerTopK:
    """``TopK`` ops."""

    name: ClassVar[str] = "topk"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if ev.fn in _FNS and ev.inputs:
                x = ev.inputs[0]
                cols = max(last_dim(x), 1)
                k = 1
                if ev.fn == "topk" and len(ev.args) > 1 and isinstance(ev.args[1], int):
                    k = max(1, ev.args[1])
                elif ev.fn in ("sort", "argsort"):
                    k = cols
                elif ev.fn == "multinomial" and len(ev.args) > 1 and isinstance(ev.args[1], int):
                    k = max(1, ev.args[1])
                lw.claim([ev.index], OpKind.TOPK, {"fn": ev.fn, "rows": numel(x) // cols, "cols": cols, "k": k})
