"""``rope``: the pointwise ops between the Q/K projections and attention that rotate Q and K.

Starting from each attention's query and key operands, the pass walks back through unclaimed
pointwise ops, ``cat`` and copies that ran in the same module call as the attention (HF applies
``apply_rotary_pos_emb`` inside the attention module; the cos/sin tables are built elsewhere) and
stops at GEMMs, norms and the KV-cache write. A walk that met a ``mul`` of two tensors (the
rotation by the cos/sin tables) is one ``Rope`` op; a multiply by a scalar alone (OPT's query
scaling ``q_proj(x) * 0.125``) is no rotation and is left to the pointwise pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, float_inputs, numel
from opgraph.capture.recorder import Event, TRef
from opgraph.ir.ops import OpKind

_ROPE_FNS = frozenset(
    {
        "mul",
        "add",
        "sub",
        "neg",
        "cat",
        "stack",
        "_to_copy",
        "clone",
        "copy",
        "view_as_complex",
        "view_as_real",
        "cos",
        "sin",
        "slice_scatter",
    }
)


def _rotates(ev: Event) -> bool:
    """A ``mul`` of two tensors of more than one element each (``q * cos``), not a scaling."""
    return ev.fn == "mul" and sum(1 for r in ev.inputs if numel(r) > 1) == 2


@dataclass(frozen=True)
class FuseRope:
    """Group each Q and K rotation into one ``Rope``."""

    name: ClassVar[str] = "rope"
    max_ops: int = 24
    """Largest rotation (in aten ops) the walk accepts."""

    def run(self, lw: Lowering) -> None:
        for g in list(lw.groups):
            if g.kind is not OpKind.ATTENTION:
                continue
            ev = lw.events[g.members[-1]] if g.target == "eager_attention" else lw.events[g.members[0]]
            if g.target == "eager_attention":
                first = lw.events[g.members[0]]
                operands = [first.inputs[-2], first.inputs[-1]]
            else:
                operands = [ev.inputs[0], ev.inputs[1]]
            for which, ref in zip(("q", "k"), operands, strict=True):
                self._walk(lw, ref, g.call, g.fields, which)

    def _walk(self, lw: Lowering, ref: TRef, call: int, attn: dict[str, object], which: str) -> None:
        members: list[int] = []
        todo = [ref.tid]
        seen: set[int] = set()
        while todo and len(members) <= self.max_ops:
            tid = todo.pop()
            if tid in seen:
                continue
            seen.add(tid)
            p = lw.producer_of(tid)
            if p is None or not lw.free(p.index) or p.fn not in _ROPE_FNS or not lw.in_call(p.call, call):
                if p is not None and lw.owner[p.index] >= 0:
                    owner = lw.groups[lw.owner[p.index]]
                    fn = owner.fields.get("fn") if owner.kind is OpKind.MEMORY else None
                    if fn == "kv_cache_write":  # continue through the cache write to the new keys
                        todo.extend(r.tid for r in p.inputs[1:])
                    elif fn == "repeat_kv":
                        todo.extend(r.tid for r in p.inputs[:1])
                continue
            members.append(p.index)
            todo.extend(r.tid for r in float_inputs(p))
        if not members or len(members) > self.max_ops:
            return
        if not any(_rotates(lw.events[m]) for m in members):
            return
        heads = int(attn["heads"] if which == "q" else attn["kv_heads"])  # type: ignore[call-overload]
        d = int(attn["head_dim"])  # type: ignore[call-overload]
        b = int(attn["batch"])  # type: ignore[call-overload]
        q_len = int(attn["q_len"])  # type: ignore[call-overload]
        lw.claim(members, OpKind.ROPE, {"tokens": b * q_len, "heads": heads, "head_dim": d}, target="rope", call=call)
