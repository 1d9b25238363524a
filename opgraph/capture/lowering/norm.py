"""``norm``: RMSNorm and LayerNorm, from the module that ran them (HF writes RMSNorm as a handful of
pointwise ops) or from the fused aten ops (``native_layer_norm``, ``rms_norm``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, float_inputs, last_dim, numel
from opgraph.ir.ops import NormVariant, OpKind

_NORM_CLASS = re.compile(r"(RMS|Rms|rms)Norm|LayerNorm|Layernorm|GroupNorm")
_FUSED = {
    "native_layer_norm": NormVariant.LAYER,
    "layer_norm": NormVariant.LAYER,
    "_fused_rms_norm": NormVariant.RMS,
    "rms_norm": NormVariant.RMS,
}


@dataclass(frozen=True)
class FuseNorms:
    """One ``Norm`` per norm-module call (or fused norm op)."""

    name: ClassVar[str] = "norm"

    def run(self, lw: Lowering) -> None:
        by_call = lw.events_by_call({i for i, c in enumerate(lw.calls) if _NORM_CLASS.search(c.cls)})
        for call, members in by_call.items():
            free = [m for m in members if lw.free(m)]
            if not free:
                continue
            evs = [lw.events[m] for m in free]
            x = next((r for e in evs for r in float_inputs(e)), None)
            if x is None:
                continue
            hidden = last_dim(x)
            rows = numel(x) // hidden if hidden else 0
            variant = NormVariant.RMS if "rms" in lw.calls[call].cls.lower() else NormVariant.LAYER
            g = lw.claim(
                free,
                OpKind.NORM,
                {"rows": rows, "hidden": hidden, "variant": variant},
                target=lw.calls[call].cls,
                call=call,
            )
            g.main_outputs = 1
        for ev in lw.free_events():
            if ev.fn in _FUSED and ev.inputs:
                x = ev.inputs[0]
                hidden = last_dim(x)
                g = lw.claim(
                    [ev.index], OpKind.NORM, {"rows": numel(x) // hidden, "hidden": hidden, "variant": _FUSED[ev.fn]}
                )
                g.main_outputs = 1
