"""``activation``: SiLU, GELU, ReLU, sigmoid, tanh; an activation whose only consumer multiplies it
by another tensor of its shape is the gated form (SwiGLU, GeGLU) and becomes one op.

An activation written in Python as several pointwise ops (BLOOM's ``bloom_gelu_forward``) stays those
ops, each lowered alone: eager PyTorch launches a kernel for each (priced as one GELU kernel, BLOOM's
measured 3.7x longer on an H100)."""

from __future__ import annotations

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
_GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh", "relu": "reglu", "sigmoid": "glu"}


@dataclass(frozen=True)
class LowerActivations:
    """Activations, fused with the gating multiply when there is one."""

    name: ClassVar[str] = "activation"
    fuse_gate: bool = True
    """Fuse ``act(gate) * up`` into one gated activation."""

    def run(self, lw: Lowering) -> None:
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
