"""The lowering context shared by the passes: events, who owns them, data-flow lookups, and groups.

A pass claims recorded events into a :class:`Group` (one future IR op) with a kind and the fields of
that kind. Passes run in order and only claim events nobody owns yet; whatever is left at the end
becomes ``Other``. IR ops are built once, from the groups, by :mod:`opgraph.capture.lowering.build`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import ValidationError

from opgraph.capture.recorder import Event, ModuleCall, TRef
from opgraph.ir.dtypes import FLOAT_NAMES
from opgraph.ir.ops import OP_TYPES, OpKind

FREE = -2
"""Owner marker of events that fold away (views, metadata ops, allocations)."""


@dataclass(slots=True)
class Group:
    """Recorded events that become one IR op."""

    members: list[int]
    kind: OpKind
    fields: dict[str, Any]
    target: str
    call: int
    """Module call that gives the op its scope."""
    definition: str | None = None
    flops: int | None = None
    outputs: list[TRef] | None = None
    """Output tensors to report instead of the members' (a fused layout copy reports attention's)."""
    input_views: dict[int, TRef] | None = None
    """Inputs to report as another view of the same tensor, by tensor id (the query as the model made
    it, where transformers viewed it in another shape for the kernel)."""
    main_outputs: int | None = None
    """Keep only the first N outputs (drop auxiliary results such as LayerNorm's mean and rstd)."""


@dataclass
class Hints:
    """What the model config says, for fields the aten stream cannot show (GQA under repeat_kv, windows)."""

    num_heads: int | None = None
    num_kv_heads: int | None = None
    mla: bool = False
    layer_windows: dict[int, int] = field(default_factory=dict)
    """Sliding-window size of each layer that has one."""


class Lowering:
    """Mutable state of one lowering run."""

    def __init__(self, events: list[Event], calls: list[ModuleCall], hints: Hints | None = None) -> None:
        self.events = events
        self.calls = calls
        self.hints = hints or Hints()
        self.owner: list[int] = [-1] * len(events)
        self.groups: list[Group] = []
        self.assumptions: list[str] = []
        self.current_pass = ""
        """Name of the pass running (for errors in its claims)."""
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list[int]] = {}
        for ev in events:
            in_tids = {r.tid for r in ev.inputs}
            for r in ev.inputs:
                self.consumers.setdefault(r.tid, []).append(ev.index)
            for r in ev.outputs:
                if ev.mutates or r.tid not in in_tids:
                    self.producer[r.tid] = ev.index
        for ev in events:
            if ev.alias:
                self.owner[ev.index] = FREE

    # ----------------------------------------------------------------- lookups
    def free(self, i: int) -> bool:
        """Whether event ``i`` is unclaimed."""
        return self.owner[i] == -1

    def free_events(self) -> Iterator[Event]:
        """The unclaimed events in order, each checked when the walk reaches it (claims made on the way count)."""
        return (ev for ev in self.events if self.owner[ev.index] == -1)

    def producer_of(self, tid: int) -> Event | None:
        """The event that wrote tensor ``tid`` (None for weights and inputs)."""
        i = self.producer.get(tid)
        return None if i is None else self.events[i]

    def consumers_of(self, tid: int) -> list[Event]:
        """Events that read ``tid`` and are not views."""
        return [self.events[i] for i in self.consumers.get(tid, ()) if self.owner[i] != FREE]

    def in_call(self, event_call: int, call: int) -> bool:
        """Whether module call ``event_call`` is ``call`` or nested in it."""
        c = event_call
        while c >= 0:
            if c == call:
                return True
            c = self.calls[c].parent
        return False

    def events_by_call(self, calls: Collection[int]) -> dict[int, list[int]]:
        """Event indices under each of ``calls`` (an event goes to the innermost of them that
        encloses it), keyed in the order of their first event."""
        out: dict[int, list[int]] = {}
        if not calls:
            return out
        for ev in self.events:
            c = ev.call
            while c >= 0 and c not in calls:
                c = self.calls[c].parent
            if c >= 0:
                out.setdefault(c, []).append(ev.index)
        return out

    def layer_window(self, call: int) -> int | None:
        """Sliding window of the layer a call belongs to."""
        if not self.hints.layer_windows or call < 0:
            return None
        from opgraph.capture.scopes import layer_of

        layer = layer_of(self.calls[call].scope)
        return None if layer is None else self.hints.layer_windows.get(layer)

    # ----------------------------------------------------------------- claiming
    def claim(
        self,
        members: list[int],
        kind: OpKind,
        fields: dict[str, Any],
        *,
        target: str | None = None,
        call: int | None = None,
        definition: str | None = None,
        flops: int | None = None,
    ) -> Group:
        """Make a group of ``members`` (events still free); returns it."""
        members = sorted(m for m in members if self.owner[m] == -1)
        if not members:
            raise ValueError("claim of no free events")
        check_fields(kind, fields, self.current_pass)
        first = self.events[members[0]]
        g = Group(
            members,
            kind,
            fields,
            target or first.target,
            first.call if call is None else call,
            definition,
            flops,
        )
        gi = len(self.groups)
        self.groups.append(g)
        for m in members:
            self.owner[m] = gi
        return g

    def fold(self, i: int) -> None:
        """Fold event ``i`` away (it launches no kernel)."""
        if self.owner[i] == -1:
            self.owner[i] = FREE


class GroupFieldsError(ValueError):
    """A pass claimed events with fields its op kind does not accept (a bug in that pass)."""


def check_fields(kind: OpKind, fields: dict[str, Any], pass_name: str = "") -> None:
    """Raise :class:`GroupFieldsError` unless ``fields`` make a valid op of ``kind`` (names, types, values).

    Run at claim time, so the error names the pass that made the mistake, not the final build.
    """
    try:
        OP_TYPES[kind].model_validate({**fields, "id": 0})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(fields)"
        who = f"lowering pass {pass_name!r}" if pass_name else "a lowering pass"
        raise GroupFieldsError(f"{who} claimed a {kind.value!r} op with bad fields: {loc}: {first['msg']}") from exc


class LoweringPass(Protocol):
    """A lowering pass: a frozen dataclass with a ``name`` whose fields are its options."""

    name: ClassVar[str]

    def run(self, lw: Lowering) -> None:
        """Claim the events this pass recognises."""


def numel(ref: TRef) -> int:
    """Elements of a recorded tensor."""
    return math.prod(ref.shape)


def last_dim(ref: TRef) -> int:
    """Size of the last dimension (1 for scalars)."""
    return ref.shape[-1] if ref.shape else 1


FLOAT_DTYPES = FLOAT_NAMES
"""IR names of the floating-point dtypes."""


def float_inputs(ev: Event) -> list[TRef]:
    """The floating-point tensors an event reads."""
    return [r for r in ev.inputs if r.dtype in FLOAT_DTYPES]
