"""``embedding``: token embedding lookups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, numel
from opgraph.ir.ops import OpKind


@dataclass(frozen=True)
class LowerEmbedding:
    """``aten.embedding`` (and ``embedding_bag``) to ``Embedding``."""

    name: ClassVar[str] = "embedding"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if ev.fn in ("embedding", "_embedding_bag") and len(ev.inputs) >= 2:
                weight, ids = ev.inputs[0], ev.inputs[1]
                lw.claim(
                    [ev.index],
                    OpKind.EMBEDDING,
                    {"tokens": numel(ids), "vocab": weight.shape[0], "hidden": weight.shape[-1]},
                )
