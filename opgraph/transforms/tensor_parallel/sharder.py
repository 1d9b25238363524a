"""The rewrite: walks the graph in program order, tracks each tensor's sharding state, dispatches
each op to the handler of its kind and inserts the collectives a whole tensor needs."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from opgraph.ir import (
    IDENTITY_FIELDS,
    Collective,
    CollectiveKind,
    Edge,
    EdgeKind,
    Gemm,
    OpBase,
    OpGraph,
    TensorSpec,
)
from opgraph.ir.dispatch import OpTypeRegistry
from opgraph.transforms.tensor_parallel.analysis import analyse
from opgraph.transforms.tensor_parallel.rules import LinearRule
from opgraph.transforms.tensor_parallel.tensors import (
    PairSplit,
    Partial,
    Split,
    State,
    TensorParallelError,
    ints,
    op_name,
    retag,
)

COLLECTIVE_TARGET: dict[CollectiveKind, str] = {
    CollectiveKind.ALL_REDUCE: "_c10d_functional.all_reduce.default",
    CollectiveKind.ALL_GATHER: "_c10d_functional.all_gather_into_tensor.default",
}
"""The aten target each inserted collective records."""

PLACEMENT_FIELDS: frozenset[str] = IDENTITY_FIELDS - {"id", "host_gap_us"}
"""Where and when an op runs (scope, layer, stage, step): an inserted collective takes them from the op it follows."""

Handler = Callable[["Sharder", Any, list[TensorSpec]], OpBase]
"""``handler(sharder, op, inputs) -> sharded op``: records its outputs' states with ``set_outputs``."""

HANDLERS: OpTypeRegistry[Handler] = OpTypeRegistry("sharding handler")
"""The sharding handler of each op class (filled by :func:`register_handler`); ops of other classes
are replicated."""


def register_handler(*op_types: type[OpBase]) -> Callable[[Handler], Handler]:
    """Decorator: make the function the sharding handler of ops of ``op_types``.

    A user's subclass of an op gets its own handler this way; ops with none are replicated. Raises
    :class:`~opgraph.ir.RegistryError` when a class already has a handler.
    """

    def wrap(fn: Handler) -> Handler:
        for t in op_types:
            HANDLERS.register(t, fn)
        return fn

    return wrap


class Sharder:
    """One rewrite of one graph: the sharding state of every tensor, the ops emitted so far, the
    collectives inserted; handlers (:data:`HANDLERS`) read and update it through its methods."""

    def __init__(
        self,
        graph: OpGraph,
        tp: int,
        rules: Sequence[LinearRule],
        embedding: str,
        lm_head: str,
        expert_parallel: bool,
    ) -> None:
        self.graph = graph
        self.tp = tp
        self.rules = tuple(rules)
        self.embedding = embedding
        self.lm_head = lm_head
        self.expert_parallel = expert_parallel
        self.state: dict[int, Split | Partial | PairSplit] = {}
        self.producer: dict[int, OpBase] = {}
        self.consumed: set[int] = set()
        self.slots: list[list[OpBase]] = []
        self.slot_of: dict[int, int] = {}
        self.materialized: dict[int, tuple[int, int]] = {}
        """Tensor id -> (collective op id, id of the whole tensor it writes)."""
        self.coll_inputs: list[tuple[int | None, int, int]] = []
        """(producer op id, collective op id, tensor id) for the edges into collectives."""
        self.rewired: dict[tuple[int, int], tuple[int, int]] = {}
        """(consumer op id, old tensor id) -> (collective op id, new tensor id)."""
        self.force: set[int] = set()
        self.next_op = max((o.id for o in graph.ops), default=-1) + 1
        self.next_tensor = (
            max((t.id for o in graph.ops for t in (*o.inputs, *o.outputs) if t.id is not None), default=-1) + 1
        )
        self.unknown: list[OpBase] = []
        self.notes: list[str] = []
        self.counts: dict[str, int] = {"all_reduce": 0, "all_gather": 0, "column": 0, "row": 0}
        self.ctx = analyse(graph, tp, self.rules)

    def state_of(self, spec: TensorSpec) -> State:
        """The sharding state of the tensor ``spec`` (``None``: replicated)."""
        return None if spec.id is None else self.state.get(spec.id)

    def new_tensor(self) -> int:
        """A fresh tensor id."""
        self.next_tensor += 1
        return self.next_tensor - 1

    def hints(self, op: OpBase) -> set[int]:
        """The head counts of ``op``'s layer: sizes a split dimension is likely to have."""
        return self.ctx.heads_by_layer.get(op.layer, set()) if op.layer is not None else set()

    def emit_collective(self, kind: CollectiveKind, tensor: int, near: OpBase) -> tuple[int, int]:
        """Insert a collective over ``tensor`` after its producer (or before ``near``)."""
        st = self.state.get(tensor)
        src = self.producer.get(tensor)
        ref = src or near
        new_tid = self.new_tensor()
        if kind is CollectiveKind.ALL_REDUCE:
            assert isinstance(st, Partial)
            spec_in, spec_out, group = st.spec, retag(st.spec, new_tid), self.tp
        else:
            assert isinstance(st, (Split, PairSplit))
            spec_in, spec_out, group = st.local, retag(st.full, new_tid), st.factor
        coll = Collective(
            id=self.next_op,
            target=COLLECTIVE_TARGET[kind],
            inputs=(spec_in,),
            outputs=(spec_out,),
            **{name: getattr(ref, name) for name in PLACEMENT_FIELDS},
            dtype=spec_in.dtype,
            collective=kind,
            bytes=spec_in.nbytes,
            group_size=group,
        )
        self.next_op += 1
        self.counts[kind.value] += 1
        if src is not None:
            self.slots[self.slot_of[src.id]].append(coll)
        else:  # a graph input: just before the op that needs it
            self.slots[self.slot_of[near.id] - 1].append(coll)
        self.coll_inputs.append((src.id if src is not None else None, coll.id, tensor))
        self.materialized[tensor] = (coll.id, new_tid)
        return coll.id, new_tid

    def whole(self, op: OpBase, spec: TensorSpec) -> TensorSpec:
        """The whole (replicated) version of ``spec`` for ``op``, inserting a collective if needed."""
        st = self.state_of(spec)
        if st is None or spec.id is None:
            return spec
        if spec.id not in self.materialized:
            kind = CollectiveKind.ALL_REDUCE if isinstance(st, Partial) else CollectiveKind.ALL_GATHER
            self.emit_collective(kind, spec.id, op)
        coll_id, new_tid = self.materialized[spec.id]
        self.rewired[(op.id, spec.id)] = (coll_id, new_tid)
        return retag(spec, new_tid)

    def all_whole(self, op: OpBase, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
        """Every input of ``op`` whole (:meth:`whole`)."""
        return [self.whole(op, s) for s in inputs]

    def rebuild(self, op: OpBase, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], **fields: Any) -> OpBase:
        """``op`` with new tensors and fields; FLOPs, bytes and definition re-derived or scaled."""
        shapes_changed = [s.shape for s in op.inputs] != [s.shape for s in inputs] or [s.shape for s in op.outputs] != [
            s.shape for s in outputs
        ]
        if not fields and not shapes_changed:
            return op.model_copy(update={"inputs": tuple(inputs), "outputs": tuple(outputs)})
        data = op.model_dump()
        for key in ("flops", "bytes_read", "bytes_written", "definition"):
            data.pop(key)
        data.update(fields)
        data["inputs"] = [s.model_dump() for s in inputs]
        data["outputs"] = [s.model_dump() for s in outputs]
        if op.call is not None and shapes_changed:
            pairs = [*zip(op.inputs, inputs, strict=True), *zip(op.outputs, outputs, strict=True)]
            changed = {a for s, t in pairs for a, b in zip(s.shape, t.shape, strict=True) if a != b}
            if any(v in changed for v in ints(op.call.model_dump())):
                data["call"] = None  # its size arguments describe the unsharded op
        new = type(op).model_validate(data)
        update: dict[str, Any] = {}
        old_flops, new_flops = op.default_flops(), new.default_flops()
        if op.flops != max(0, int(old_flops)):
            update["flops"] = round(op.flops * (new_flops / old_flops)) if old_flops else op.flops
        old_r, old_w = op.default_bytes()
        new_r, new_w = new.default_bytes()
        if op.bytes_read != max(0, int(old_r)):
            update["bytes_read"] = round(op.bytes_read * (new_r / old_r)) if old_r else op.bytes_read
        if op.bytes_written != max(0, int(old_w)):
            update["bytes_written"] = round(op.bytes_written * (new_w / old_w)) if old_w else op.bytes_written
        if op.definition != op.default_definition():
            update["definition"] = self.definition(op, new)
        return new.model_copy(update=update) if update else new

    def definition(self, old: OpBase, new: OpBase) -> str:
        """A custom (capture-given) definition for the sharded op: MoE ``_i{I}`` becomes the local size."""
        name = old.definition
        if isinstance(old, Gemm) and isinstance(new, Gemm):
            if new.groups != old.groups or (old.expert is not None and new.batch != old.batch):
                return f"{name}_ep{self.tp}"  # split by expert (grouped) or by token-expert pair (batched_mm)
            m = re.search(r"_i(\d+)", name)
            if m:
                local = int(m.group(1)) * (new.n / old.n) * (new.k / old.k)
                if local.is_integer() and local >= 1:
                    return f"{name[: m.start()]}_i{int(local)}{name[m.end() :]}"
        return f"{name}_tp{self.tp}"

    def fail(self, op: OpBase, what: str, size: int, factor: int, hint: str | None = None) -> TensorParallelError:
        return TensorParallelError(
            f"{op_name(op)}: {what}={size} is not divisible by tp={factor}",
            where=f"op {op.id}",
            hint=hint or f"choose a tp that divides {size}",
        )

    def run(self) -> OpGraph:
        """Shard every op in program order, complete unread partial sums, and build the graph."""
        for op in self.graph.ops:
            self.slots.append([])  # collectives over graph inputs that this op reads
            self.slot_of[op.id] = len(self.slots)
            self.slots.append([])  # the op, then collectives over what it writes
            for t in op.outputs:  # a tensor written again: earlier reductions or gathers are stale
                if t.id is not None:
                    self.materialized.pop(t.id, None)
                    self.force.discard(t.id)
            new = self.process(op)
            self.slots[self.slot_of[op.id]].insert(0, new)
            for t in op.inputs:
                if t.id is not None:
                    self.consumed.add(t.id)
            for t in new.outputs:
                if t.id is not None:
                    self.producer[t.id] = new
        # A partial sum that nothing reads is still a result: complete it.
        for tid, st in list(self.state.items()):
            if isinstance(st, Partial) and tid not in self.consumed and tid not in self.materialized:
                self.emit_collective(CollectiveKind.ALL_REDUCE, tid, self.producer[tid])
        ops = tuple(o for slot in self.slots for o in slot)
        return self.assemble(ops)

    def assemble(self, ops: tuple[OpBase, ...]) -> OpGraph:
        """The sharded graph: ``ops``, edges rewired through the collectives, the assumptions made."""
        edges: list[Edge] = []
        seen: set[tuple[int, int, EdgeKind, int | None]] = set()

        def add(e: Edge) -> None:
            key = (e.src, e.dst, e.kind, e.tensor)
            if key not in seen and e.src != e.dst:
                seen.add(key)
                edges.append(e)

        for e in self.graph.edges:
            if e.kind is EdgeKind.DATA and e.tensor is not None and (e.dst, e.tensor) in self.rewired:
                coll, new_tid = self.rewired[(e.dst, e.tensor)]
                add(Edge(src=coll, dst=e.dst, kind=EdgeKind.DATA, tensor=new_tid))
            else:
                add(e)
        for src, coll, tid in self.coll_inputs:
            if src is not None:
                add(Edge(src=src, dst=coll, kind=EdgeKind.DATA, tensor=tid))
        for (dst, _old), (coll, new_tid) in self.rewired.items():
            add(Edge(src=coll, dst=dst, kind=EdgeKind.DATA, tensor=new_tid))

        md = self.graph.metadata
        capture = {**md.capture, "tp": self.tp}
        head = "vocab-parallel lm_head + all-gather" if self.lm_head == "vocab_parallel" else "replicated lm_head"
        emb = "vocab-parallel embedding + all-reduce" if self.embedding == "vocab_parallel" else "replicated embedding"
        moe = (
            "expert-parallel experts (groups / tp; batched_mm experts: token-expert pairs / tp)"
            if self.expert_parallel
            else "experts split inside (n or k / tp)"
        )
        lines = [
            f"tensor parallel tp={self.tp} (Megatron-style; this is the graph of one rank, every rank runs it): "
            f"{self.counts['column']} column-parallel GEMMs (n / tp), {self.counts['row']} row-parallel GEMMs "
            f"(k / tp, partial sums); attention heads / tp, KV heads / tp or one replicated KV head per rank when "
            f"kv_heads < tp; {moe}; {emb}; {head}; norms, residual adds and routers replicated; "
            f"{self.counts['all_reduce']} all-reduce and {self.counts['all_gather']} all-gather ops inserted"
        ]
        if self.unknown:
            shown = ", ".join(f"{o.id} {o.scope or o.target}" for o in self.unknown[:8])
            more = f" and {len(self.unknown) - 8} more" if len(self.unknown) > 8 else ""
            lines.append(
                f"tensor parallel: {len(self.unknown)} GEMM(s) no sharding rule knows, left replicated: {shown}{more}"
            )
        lines.extend(dict.fromkeys(self.notes))
        meta = md.model_copy(update={"capture": capture, "assumptions": (*md.assumptions, *lines)})
        out = OpGraph(metadata=meta, ops=ops, edges=tuple(edges))
        out.lint()
        return out

    def process(self, op: OpBase) -> OpBase:
        """The sharded ``op``: its inputs made whole where they must be, then its kind's handler."""
        # Inputs the lm_head all-gather replaced are read whole by everyone; a partial sum that was
        # already reduced for an earlier reader is read reduced (the residual stream after the
        # embedding's all-reduce), so each reduction happens once, at its producer.
        inputs = [
            self.whole(op, s)
            if s.id in self.force or (s.id in self.materialized and isinstance(self.state_of(s), Partial))
            else s
            for s in op.inputs
        ]
        handler = HANDLERS.lookup(op)
        if handler is None:  # top-k, other, ...: they need whole tensors
            return self.replicated(op, inputs)
        return handler(self, op, inputs)

    def replicated(self, op: OpBase, inputs: Sequence[TensorSpec]) -> OpBase:
        """``op`` computed whole on every rank: its inputs made whole, its outputs replicated."""
        new_inputs = self.all_whole(op, inputs)
        self.set_outputs(op.outputs, None)
        return self.rebuild(op, new_inputs, op.outputs)

    def set_outputs(self, outputs: Sequence[TensorSpec], states: Sequence[State] | None) -> None:
        """Record the state of each output (``None``: all replicated)."""
        for i, t in enumerate(outputs):
            if t.id is None:
                continue
            st = states[i] if states is not None else None
            if st is None:
                self.state.pop(t.id, None)
            else:
                self.state[t.id] = st
