"""``rope``: the pointwise ops between the Q/K projections and attention that rotate Q and K.

Starting from each attention's query and key operands, the pass walks back through unclaimed
pointwise ops, ``cat`` and copies that ran in the same module call as the attention (HF applies
``apply_rotary_pos_emb`` inside the attention module; the cos/sin tables are built elsewhere) and
stops at GEMMs, norms and the KV-cache write; a ``cat`` over the tokens (a cache appending the new
keys), a ``copy_`` into a slice of a tensor being assembled (MLA's keys) and a ``clone`` that makes the
rotated query contiguous (eager attention's ``matmul`` of a transposed query) are walked through but left
out, ops of their own. A walk that met a ``mul`` of two tensors (the
rotation by the cos/sin tables) is one ``Rope`` op; a multiply by a scalar alone (OPT's query
scaling ``q_proj(x) * 0.125``) is no rotation and is left to the pointwise pass. The op's heads,
head size and rotated part come from the tensors the walk rotates (:func:`_rope_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, float_inputs, last_dim, numel
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


_COPIES = frozenset({"_to_copy", "clone", "copy"})
"""Copies a rotation may end with (``q_embed.to(dtype)``); the rotated part is the copied tensor's."""


def _appends_tokens(ev: Event) -> bool:
    """A ``cat`` that joins along a dimension before the last, or onto an empty tensor: a cache appending
    the new tokens' keys (``DynamicCache``'s ``cat`` over the sequence, as MLA's shared rope key takes
    it), not a part of the rotation, whose ``cat`` joins head-dimension halves or parts along the last."""
    if ev.fn != "cat" or not ev.outputs:
        return False
    out = ev.outputs[0].shape
    # a prefill appends to an empty cache (an input of no elements), a decode to the cached tokens
    return any(numel(r) == 0 or (len(r.shape) == len(out) and r.shape[:-1] != out[:-1]) for r in ev.inputs)


def _lays_out(ev: Event) -> bool:
    """A ``clone`` that makes a strided tensor contiguous (``torch.matmul`` of a transposed query, before eager
    attention's scores): a copy of its own that the rotation's output pays for, not part of the rotation."""
    if ev.fn != "clone" or not ev.inputs or not ev.outputs:
        return False
    return ev.inputs[0].strides is not None and ev.outputs[0].strides is None


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
            if p is not None and p.fn == "copy_" and p.mutates and lw.free(p.index) and lw.in_call(p.call, call):
                # a copy into a slice of a tensor being put together (MLA's keys: the rotated key copied
                # over the heads): walk through to what it copies; the memory pass lowers the copy
                todo.extend(r.tid for r in float_inputs(p))
                continue
            if p is None or not lw.free(p.index) or p.fn not in _ROPE_FNS or not lw.in_call(p.call, call):
                if p is not None and lw.owner[p.index] >= 0:
                    owner = lw.groups[lw.owner[p.index]]
                    fn = owner.fields.get("fn") if owner.kind is OpKind.MEMORY else None
                    if fn == "kv_cache_write":  # continue through the cache write to the new keys
                        todo.extend(r.tid for r in p.inputs[1:])
                    elif fn == "repeat_kv":
                        todo.extend(r.tid for r in p.inputs[:1])
                continue
            if _appends_tokens(p) or _lays_out(p):
                # walk through to the new keys, or to the rotated tensor a layout copy makes contiguous (eager
                # attention's matmul of a transposed query); the memory pass lowers the append or the copy
                todo.extend(r.tid for r in float_inputs(p))
                continue
            members.append(p.index)
            todo.extend(r.tid for r in float_inputs(p))
        if not members or len(members) > self.max_ops:
            return
        if not any(_rotates(lw.events[m]) for m in members):
            return
        lw.claim(members, OpKind.ROPE, _rope_fields(lw, members, attn, which), target="rope", call=call)


def _rope_fields(lw: Lowering, members: list[int], attn: dict[str, object], which: str) -> dict[str, int]:
    """``Rope`` fields from the tensors the rotation writes, not from the attention it feeds.

    ``members[0]``, the first event the walk met, writes the rope's output: its last dimension is the
    head size, and its elements per token over that are the heads. The rotated part is what descends
    from the cos/sin products (see :func:`_rotated_output`); ``rotary_dim`` is set where that is less
    than the head (partial rotary: GPT-NeoX, Phi; MLA's query, ``cat(q_nope, q_rope)``). MLA's shared
    rope key is so one head of ``qk_rope_head_dim``, broadcast to the heads only afterwards. Where
    the shapes do not divide this way, the attention's heads and head size are used.
    """
    b = int(attn["batch"])  # type: ignore[call-overload]
    tokens = b * int(attn["q_len"])  # type: ignore[call-overload]
    fallback = {
        "tokens": tokens,
        "heads": int(attn["heads"] if which == "q" else attn["kv_heads"]),  # type: ignore[call-overload]
        "head_dim": int(attn["head_dim"]),  # type: ignore[call-overload]
    }
    rotated: set[int] = set()
    for m in sorted(members):  # event order is data-flow order
        ev = lw.events[m]
        if _rotates(ev) or any(r.tid in rotated for r in ev.inputs):
            rotated.update(r.tid for r in ev.outputs)
    found = _rotated_output(lw, lw.events[members[0]], set(members), rotated)
    if found is None or tokens <= 0:
        return fallback
    out, rotated_numel = found
    head_dim = last_dim(out)
    per_token, rem = divmod(numel(out), tokens)
    if rem or head_dim <= 0 or per_token % head_dim:
        return fallback
    heads = per_token // head_dim
    rot_per_token, rem = divmod(rotated_numel, tokens)
    if rem or rot_per_token <= 0 or rot_per_token % heads or rot_per_token > per_token:
        return fallback
    rotary_dim = rot_per_token // heads
    fields = {"tokens": tokens, "heads": heads, "head_dim": head_dim}
    if rotary_dim < head_dim:
        fields["rotary_dim"] = rotary_dim
    return fields


def _rotated_output(lw: Lowering, ev: Event, members: set[int], rotated: set[int]) -> tuple[TRef, int] | None:
    """The rope's output tensor and how many of its elements were rotated, from its last event ``ev``.

    Seen through the casts and copies at the end: a ``cat`` along the last dimension that appends
    untouched slices to the rotated ones (partial rotary) rotates only those; a ``cat`` along another
    dimension (the cached keys before the new ones) is no part of the rotation, whose output is then
    its one rotated input. Anything else rotated all of its output.
    """
    out: TRef | None = ev.outputs[0] if ev.outputs else None
    while out is not None:
        if ev.fn in _COPIES and ev.inputs:
            src = ev.inputs[-1] if ev.fn == "copy" else ev.inputs[0]
            p = lw.producer_of(src.tid)
            if p is None or p.index not in members:
                return out, numel(out)
            ev = p
            continue
        if ev.fn != "cat":
            return out, numel(out)
        parts = [r for r in ev.inputs if numel(r) > 0]
        rot = [r for r in parts if r.tid in rotated]
        if ev.outputs and all(r.shape[:-1] == ev.outputs[0].shape[:-1] for r in parts):  # last dimension
            return out, sum(numel(r) for r in rot)
        if len(rot) != 1:
            return None
        out = rot[0]
        p = lw.producer_of(out.tid)
        if p is None or p.index not in members:
            return out, numel(out)
        ev = p
    return None
