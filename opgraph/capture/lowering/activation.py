"""``activation``: SiLU, GELU, ReLU, sigmoid, tanh; an activation whose only consumer multiplies it
by another tensor of its shape is the gated form (SwiGLU, GeGLU) and becomes one op."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, last_dim, numel
from opgraph.ir.ops import OpKind

ACT_FNS = {
    "silu": "silu",
    "gelu": "gelu",
    "relu": "relu",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "hardswish": "hardswish",
    "mish": "mish",
    "elu": "elu",
    "leaky_relu": "leaky_relu",
    "softplus": "softplus",
}
_ACT_CLASS = re.compile(r"(Gelu|GELU|SiLU|Silu|Swish|ReLU|Relu|QuickGELU)(Activation)?$")
_GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh", "relu": "reglu", "sigmoid": "glu"}


@dataclass(frozen=True)
class LowerActivations:
    """Activations, fused with the gating multiply when there is one."""

    name: ClassVar[str] = "activation"
    fuse_gate: bool = True
    """Fuse ``act(gate) * up`` into one gated activation."""

    def run(self, lw: Lowering) -> None:
        self._modules(lw)
        for ev in lw.free_events():
            if ev.fn not in ACT_FNS or not ev.outputs:
                continue
            fn = ACT_FNS[ev.fn]
            if fn == "gelu" and ev.kwargs.get("approximate") == "tanh":
                fn = "gelu_tanh"
            out = ev.outputs[0]
            members = [ev.index]
            gated = False
            if self.fuse_gate and fn in _GATED:
                cons = lw.consumers_of(out.tid)
                if len(cons) == 1:
                    c = cons[0]
                    same = c.outputs and c.outputs[0].shape == out.shape
                    if (
                        c.fn == "mul"
                        and lw.free(c.index)
                        and len(c.inputs) == 2
                        and same
                        and lw.in_call(ev.call, c.call)
                    ):
                        members.append(c.index)
                        gated = True
                        fn = _GATED[fn]
            lw.claim(
                members,
                OpKind.ACTIVATION,
                {"fn": fn, "numel": numel(out), "hidden": last_dim(out), "gated": gated},
                call=lw.events[members[-1]].call,
            )

    def _modules(self, lw: Lowering) -> None:
        """Activation modules written as several pointwise ops (BLOOM's tanh GELU) become one op."""
        calls = {i for i, c in enumerate(lw.calls) if _ACT_CLASS.search(c.cls)}
        if not calls:
            return
        members: dict[int, list[int]] = {}
        for ev in lw.free_events():
            if ev.call in calls and ev.outputs:
                members.setdefault(ev.call, []).append(ev.index)
        for call, evs in members.items():
            if len(evs) < 2:
                continue  # a single aten activation is handled below, with gating
            cls = lw.calls[call].cls.lower()
            fn = "gelu_tanh" if "gelu" in cls else "silu" if ("silu" in cls or "swish" in cls) else "relu"
            out = lw.events[evs[-1]].outputs[0]
            lw.claim(
                evs,
                OpKind.ACTIVATION,
                {"fn": fn, "numel": numel(out), "hidden": last_dim(out)},
                target=lw.calls[call].cls,
                call=call,
            )
