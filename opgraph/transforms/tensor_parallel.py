"""Megatron-style tensor-parallel sharding: the graph that ONE rank of a ``tp``-way run executes.

All ranks run the same sharded graph (SPMD), so one rank's graph plus ``--tp N`` in the simulator
is the whole run. The pass follows Megatron-LM and vLLM:

- Linear layers are found by their module ``scope`` through a small table of rules
  (:data:`DEFAULT_LINEAR_RULES`): column-parallel layers (q/k/v/qkv, gate/up/gate_up, MoE expert
  gate_up, MLA ``q_b_proj``/``kv_b_proj``) keep ``n / tp`` output features; row-parallel layers
  (o_proj, down_proj, expert down) keep ``k / tp`` input features and produce partial sums that an
  ``all_reduce`` completes; router GEMMs and MLA down-projections stay replicated; GEMMs no rule
  knows stay replicated and are listed in the graph's assumptions.
- Sharding is propagated through the data flow: every tensor is replicated, split (a feature or
  head dimension divided by a factor) or partial (a sum still to be reduced). Pointwise ops on split
  tensors (RoPE, norms over heads, activations, KV-cache writes) shrink with them; attention keeps
  ``heads / tp`` query heads and ``kv_heads / tp`` key/value heads, or one replicated KV head
  per rank when ``kv_heads < tp`` (as vLLM does). Where an op needs a whole tensor, a collective is
  inserted right after the tensor's producer: ``all_reduce`` for partial sums (so the all-reduce
  of an MoE layer comes after the combine, as in vLLM's fused MoE), ``all_gather`` for splits.
- Embedding: vocab-parallel (each rank holds ``vocab / tp`` rows, masked lookup, then an
  all-reduce) by default, or replicated. ``lm_head``: column-parallel over the (padded) vocabulary
  followed by an all-gather of the logits by default, or replicated.

Op ids are kept (a sharded op has the id it had before, so timelines of TP=1 and TP=N runs can be
compared op by op); inserted collectives get new ids above the largest. Each changed op is built
anew from its changed fields so the IR derives FLOPs, bytes and the definition; values a capture
pass had set differently from the derived ones are scaled by the same ratio instead.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from opgraph.ir import (
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    Edge,
    EdgeKind,
    Elementwise,
    Embedding,
    Gemm,
    Memory,
    MoeRouting,
    Norm,
    OpBase,
    OpGraph,
    OpgraphError,
    OpKind,
    Reduction,
    Rope,
    Softmax,
    TensorSpec,
    View,
)

__all__ = [
    "DEFAULT_LINEAR_RULES",
    "LinearRule",
    "ParallelStyle",
    "TensorParallelError",
    "linear_style",
    "shard_tensor_parallel",
]


class TensorParallelError(OpgraphError):
    """A graph cannot be sharded for the requested tensor-parallel degree."""


class ParallelStyle(str, Enum):
    """How a linear layer is split over the ranks."""

    COLUMN = "column"
    """Output features split: ``n / tp``; the output is split, no communication."""
    ROW = "row"
    """Input features split: ``k / tp``; the output is a partial sum (an all-reduce follows)."""
    REPLICATED = "replicated"
    """Every rank computes the whole layer."""
    VOCAB = "vocab"
    """Column-parallel over the (padded) vocabulary, then an all-gather of the logits."""


@dataclass(frozen=True)
class LinearRule:
    """Maps GEMMs to a :class:`ParallelStyle` by module scope (and optionally target).

    ``scope`` and ``target`` are regular expressions searched in the op's ``scope`` and ``target``.
    ``moe_experts`` marks stacked expert GEMMs, which ``expert_parallel=True`` splits by expert
    instead.
    """

    scope: str
    style: ParallelStyle
    target: str | None = None
    moe_experts: bool = False

    def matches(self, op: OpBase) -> bool:
        """Whether the rule applies to ``op``."""
        if not re.search(self.scope, op.scope):
            return False
        return self.target is None or re.search(self.target, op.target) is not None


def _names(*names: str) -> str:
    return r"(?:^|\.)(?:" + "|".join(names) + r")$"


DEFAULT_LINEAR_RULES: tuple[LinearRule, ...] = (
    # Stacked MoE experts (one grouped GEMM per family): gate_up is column, down is row.
    LinearRule(r"(?:^|\.)experts$", ParallelStyle.COLUMN, target=r"gate_up|w13|w1\b|up", moe_experts=True),
    LinearRule(r"(?:^|\.)experts$", ParallelStyle.ROW, target=r"down|w2\b", moe_experts=True),
    # Routers and low-rank (MLA) down-projections: small, replicated (vLLM ReplicatedLinear).
    LinearRule(
        _names("gate", "router", "shared_expert_gate", "q_a_proj", "kv_a_proj_with_mqa", "kv_a_proj"),
        ParallelStyle.REPLICATED,
    ),
    # Column-parallel: attention input projections and MLP up-projections.
    LinearRule(
        _names(
            "q_proj",
            "k_proj",
            "v_proj",
            "qkv_proj",
            "query_key_value",
            "Wqkv",
            "W_pack",
            "c_attn",
            "q_b_proj",
            "kv_b_proj",
            "linear_qkv",
            "gate_proj",
            "up_proj",
            "gate_up_proj",
            "w1",
            "w3",
            "c_fc",
            "fc1",
            "fc_in",
            "dense_h_to_4h",
            "linear_fc1",
        ),
        ParallelStyle.COLUMN,
    ),
    # Row-parallel: attention output projections and MLP down-projections.
    LinearRule(
        _names(
            "o_proj",
            "out_proj",
            "wo",
            "c_proj",
            "down_proj",
            "w2",
            "fc2",
            "fc_out",
            "dense_4h_to_h",
            "linear_proj",
            "linear_fc2",
        ),
        ParallelStyle.ROW,
    ),
    LinearRule(r"(?:^|\.)(?:self_attention|attention|attn)\.dense$", ParallelStyle.ROW),
    # The output head: vocab-parallel (an all-gather of the logits follows).
    LinearRule(_names("lm_head", "embed_out", "output"), ParallelStyle.VOCAB),
)
"""The default rules, most specific first; the first rule that matches decides."""


def linear_style(op: OpBase, rules: Sequence[LinearRule] = DEFAULT_LINEAR_RULES) -> LinearRule | None:
    """The first rule of ``rules`` that matches the GEMM ``op``, or ``None`` (unknown: replicated)."""
    for rule in rules:
        if rule.matches(op):
            return rule
    return None


# ---------------------------------------------------------------- tensor states
@dataclass(frozen=True)
class _Split:
    """A tensor whose rank-local part is ``1 / factor`` of it along one dimension."""

    factor: int
    block: int
    """Elements of the split dimension and all inner ones, unsharded, in the producer's layout."""
    full: TensorSpec
    """The unsharded tensor as its producer wrote it."""
    local: TensorSpec
    """The rank-local tensor as the sharded producer writes it."""


@dataclass(frozen=True)
class _Partial:
    """A tensor every rank holds whole, but as a partial sum over the ranks."""

    spec: TensorSpec


_State = _Split | _Partial | None

_LINEAR_PROPAGATING = frozenset({"copy", "cast", "clone", "contiguous", "view", "reshape", "_to_copy"})
_COLLECTIVE_TARGET = {
    CollectiveKind.ALL_REDUCE: "_c10d_functional.all_reduce.default",
    CollectiveKind.ALL_GATHER: "_c10d_functional.all_gather_into_tensor.default",
}
_WALK_KINDS = frozenset({OpKind.ROPE, OpKind.NORM, OpKind.MEMORY, OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.ACTIVATION})


def _op_name(op: OpBase) -> str:
    return f"{op.scope or op.target or 'op'} ({op.kind.value})"


def _reshard(spec: TensorSpec, dim: int, factor: int, *, ceil: bool = False) -> TensorSpec:
    """``spec`` with dimension ``dim`` divided by ``factor`` (strides of outer dims follow)."""
    shape = list(spec.shape)
    size = shape[dim]
    shape[dim] = -(-size // factor) if ceil else size // factor
    strides = spec.strides
    if strides is not None:
        inner = strides[dim] * size
        strides = tuple(
            s * shape[dim] // size if i != dim and s >= inner > 0 and (s * shape[dim]) % size == 0 else s
            for i, s in enumerate(strides)
        )
    return spec.model_copy(update={"shape": tuple(shape), "strides": strides})


def _retag(spec: TensorSpec, tensor_id: int) -> TensorSpec:
    return spec.model_copy(update={"id": tensor_id})


def _ints(value: object) -> Iterable[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _ints(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _ints(v)


@dataclass
class _Context:
    """Facts about the unsharded graph gathered before the rewrite."""

    heads_by_layer: dict[int | None, set[int]] = field(default_factory=dict)
    kv_factor: dict[int, int] = field(default_factory=dict)
    """GEMM op id -> split factor for K/V projections whose heads are fewer than ``tp``."""


class _Sharder:
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
        self.state: dict[int, _Split | _Partial] = {}
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
        self.ctx = self._analyse()

    # ------------------------------------------------------------ analysis
    def _analyse(self) -> _Context:
        ctx = _Context()
        tp = self.tp
        ops = self.graph.ops
        writers: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            for t in op.outputs:
                if t.id is not None:
                    writers.setdefault(t.id, []).append(i)

        def writer_before(tensor: int | None, at: int) -> OpBase | None:
            idx = writers.get(tensor) if tensor is not None else None
            if not idx:
                return None
            k = bisect.bisect_left(idx, at)
            return ops[idx[k - 1]] if k else None

        index = {o.id: i for i, o in enumerate(ops)}

        def walk(i: int, specs: Iterable[TensorSpec], depth: int = 8) -> set[int]:
            """GEMMs that feed ``specs`` (read by op ``i``) through pointwise ops."""
            found: set[int] = set()
            frontier = [(i, s) for s in specs]
            while frontier and depth > 0:
                depth -= 1
                nxt: list[tuple[int, TensorSpec]] = []
                for at, spec in frontier:
                    src = writer_before(spec.id, at)
                    if src is None:
                        continue
                    if src.kind is OpKind.GEMM:
                        rule = linear_style(src, self.rules)
                        if rule is not None and rule.style is ParallelStyle.COLUMN:
                            found.add(src.id)
                    elif src.kind in _WALK_KINDS:
                        nxt.extend((index[src.id], s) for s in src.inputs)
                frontier = nxt
            return found

        for i, op in enumerate(ops):
            if not isinstance(op, Attention):
                continue
            ctx.heads_by_layer.setdefault(op.layer, set()).update({op.heads, op.kv_heads})
            if op.heads % tp:
                raise TensorParallelError(
                    f"{_op_name(op)}: attention heads={op.heads} is not divisible by tp={tp}",
                    where=f"op {op.id}",
                    hint=f"choose a tp that divides {op.heads}",
                )
            if op.kv_heads % tp and tp % op.kv_heads:
                raise TensorParallelError(
                    f"{_op_name(op)}: kv_heads={op.kv_heads} and tp={tp} do not divide one another",
                    where=f"op {op.id}",
                    hint="KV heads are split when tp divides them and replicated when they divide tp",
                )
            q_gemms = walk(i, op.inputs[:1])
            kv_all = walk(i, op.inputs[1:])
            kv_gemms, fused = kv_all - q_gemms, kv_all & q_gemms
            if op.kv_heads < tp and fused:
                raise TensorParallelError(
                    f"{_op_name(op)}: a fused QKV projection with kv_heads={op.kv_heads} < tp={tp} "
                    "(KV heads replicated inside one GEMM) is not supported",
                    where=f"op {op.id}",
                    hint=f"use tp <= {op.kv_heads}",
                )
            if op.kv_heads < tp:
                for g in kv_gemms:
                    ctx.kv_factor[g] = op.kv_heads
        return ctx

    # ------------------------------------------------------------ helpers
    def _state(self, spec: TensorSpec) -> _State:
        return None if spec.id is None else self.state.get(spec.id)

    def _new_tensor(self) -> int:
        self.next_tensor += 1
        return self.next_tensor - 1

    def _hints(self, op: OpBase) -> set[int]:
        return self.ctx.heads_by_layer.get(op.layer, set()) if op.layer is not None else set()

    def _pick_dim(
        self,
        shape: Sequence[int],
        factor: int,
        block: int | None,
        hints: set[int],
        strides: Sequence[int] | None = None,
    ) -> int | None:
        """The dimension of ``shape`` to split by ``factor`` (None when none divides).

        First the dimension whose extent (it and the dims inside it) is the producer's split
        ``block`` (broadcast dims of stride 0 count as 1), then a dimension the size of the layer's
        head counts, then the last dimension, then any.
        """

        def ok(d: int) -> bool:
            return shape[d] > 1 and shape[d] % factor == 0 and not (strides is not None and strides[d] == 0)

        rank = len(shape)
        if block is not None:
            dense = [1 if strides is not None and strides[i] == 0 else n for i, n in enumerate(shape)]
            for d in range(rank):
                if dense[d] > 1 and math.prod(dense[d:]) == block:
                    if ok(d):
                        return d
                    break
        start = 1 if rank >= 3 else 0
        for d in range(start, rank):
            if shape[d] in hints and ok(d):
                return d
        if rank and ok(rank - 1):
            return rank - 1
        for d in reversed(range(rank)):
            if ok(d):
                return d
        return None

    def _emit_collective(self, kind: CollectiveKind, tensor: int, near: OpBase) -> tuple[int, int]:
        """Insert a collective over ``tensor`` after its producer (or before ``near``)."""
        st = self.state.get(tensor)
        src = self.producer.get(tensor)
        ref = src or near
        new_tid = self._new_tensor()
        if kind is CollectiveKind.ALL_REDUCE:
            assert isinstance(st, _Partial)
            spec_in, spec_out, group = st.spec, _retag(st.spec, new_tid), self.tp
        else:
            assert isinstance(st, _Split)
            spec_in, spec_out, group = st.local, _retag(st.full, new_tid), st.factor
        coll = Collective(
            id=self.next_op,
            target=_COLLECTIVE_TARGET[kind],
            inputs=(spec_in,),
            outputs=(spec_out,),
            scope=ref.scope,
            layer=ref.layer,
            stage=ref.stage,
            step=ref.step,
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

    def _whole(self, op: OpBase, spec: TensorSpec) -> TensorSpec:
        """The whole (replicated) version of ``spec`` for ``op``, inserting a collective if needed."""
        st = self._state(spec)
        if st is None or spec.id is None:
            return spec
        if spec.id not in self.materialized:
            kind = CollectiveKind.ALL_REDUCE if isinstance(st, _Partial) else CollectiveKind.ALL_GATHER
            self._emit_collective(kind, spec.id, op)
        coll_id, new_tid = self.materialized[spec.id]
        self.rewired[(op.id, spec.id)] = (coll_id, new_tid)
        return _retag(spec, new_tid)

    def _all_whole(self, op: OpBase, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
        return [self._whole(op, s) for s in inputs]

    def _rebuild(
        self, op: OpBase, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], **fields: Any
    ) -> OpBase:
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
            if any(v in changed for v in _ints(op.call.model_dump())):
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
            update["definition"] = self._definition(op, new)
        return new.model_copy(update=update) if update else new

    def _definition(self, old: OpBase, new: OpBase) -> str:
        """A custom (capture-given) definition for the sharded op: MoE ``_i{I}`` becomes the local size."""
        name = old.definition
        if isinstance(old, Gemm) and isinstance(new, Gemm):
            if new.groups != old.groups:
                return f"{name}_ep{self.tp}"
            m = re.search(r"_i(\d+)", name)
            if m:
                local = int(m.group(1)) * (new.n / old.n) * (new.k / old.k)
                if local.is_integer() and local >= 1:
                    return f"{name[: m.start()]}_i{int(local)}{name[m.end() :]}"
        return f"{name}_tp{self.tp}"

    def _fail(self, op: OpBase, what: str, size: int, factor: int, hint: str | None = None) -> TensorParallelError:
        return TensorParallelError(
            f"{_op_name(op)}: {what}={size} is not divisible by tp={factor}",
            where=f"op {op.id}",
            hint=hint or f"choose a tp that divides {size}",
        )

    # ------------------------------------------------------------ the pass
    def run(self) -> OpGraph:
        for op in self.graph.ops:
            self.slots.append([])  # collectives over graph inputs that this op reads
            self.slot_of[op.id] = len(self.slots)
            self.slots.append([])  # the op, then collectives over what it writes
            for t in op.outputs:  # a tensor written again: earlier reductions or gathers are stale
                if t.id is not None:
                    self.materialized.pop(t.id, None)
                    self.force.discard(t.id)
            new = self._process(op)
            self.slots[self.slot_of[op.id]].insert(0, new)
            for t in op.inputs:
                if t.id is not None:
                    self.consumed.add(t.id)
            for t in new.outputs:
                if t.id is not None:
                    self.producer[t.id] = new
        # A partial sum that nothing reads is still a result: complete it.
        for tid, st in list(self.state.items()):
            if isinstance(st, _Partial) and tid not in self.consumed and tid not in self.materialized:
                self._emit_collective(CollectiveKind.ALL_REDUCE, tid, self.producer[tid])
        ops = tuple(o for slot in self.slots for o in slot)
        return self._assemble(ops)

    def _assemble(self, ops: tuple[OpBase, ...]) -> OpGraph:
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
        moe = "expert-parallel experts (groups / tp)" if self.expert_parallel else "experts split inside (n or k / tp)"
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

    def _process(self, op: OpBase) -> OpBase:
        # Inputs the lm_head all-gather replaced are read whole by everyone; a partial sum that was
        # already reduced for an earlier reader is read reduced (the residual stream after the
        # embedding's all-reduce), so each reduction happens once, at its producer.
        inputs = [
            self._whole(op, s)
            if s.id in self.force or (s.id in self.materialized and isinstance(self._state(s), _Partial))
            else s
            for s in op.inputs
        ]
        if isinstance(op, Gemm):
            return self._gemm(op, inputs)
        if isinstance(op, Attention):
            return self._attention(op, inputs)
        if isinstance(op, Embedding):
            return self._embedding(op, inputs)
        if isinstance(op, MoeRouting):
            return self._moe_routing(op, inputs)
        if isinstance(op, (Rope, Norm, Activation, Elementwise, Memory, View, Softmax, Reduction)):
            return self._pointwise(op, inputs)
        # TopK, Other, ...: they need whole tensors.
        return self._replicated(op, inputs)

    def _replicated(self, op: OpBase, inputs: Sequence[TensorSpec]) -> OpBase:
        new_inputs = self._all_whole(op, inputs)
        self._set_outputs(op.outputs, None)
        return self._rebuild(op, new_inputs, op.outputs)

    def _set_outputs(self, outputs: Sequence[TensorSpec], states: Sequence[_State] | None) -> None:
        """Record the state of each output (``None``: all replicated)."""
        for i, t in enumerate(outputs):
            if t.id is None:
                continue
            st = states[i] if states is not None else None
            if st is None:
                self.state.pop(t.id, None)
            else:
                self.state[t.id] = st

    # ------------------------------------------------------------ GEMM
    def _gemm_roles(self, op: Gemm, inputs: Sequence[TensorSpec]) -> tuple[int | None, list[int], list[int]]:
        """(activation index, weight indices, bias indices) of a GEMM's inputs, from their shapes.

        The activation is ``rows x k``; a bias is a vector of ``n``; everything else is a weight.
        When shapes are ambiguous, the input some op produced is the activation.
        """
        rows = op.m * op.batch * op.groups
        biases = [j for j, s in enumerate(inputs) if len(s.shape) == 1 and s.numel == op.n]
        rest = [j for j in range(len(inputs)) if j not in biases]
        fits = [j for j in rest if inputs[j].shape and inputs[j].shape[-1] == op.k and inputs[j].numel == rows * op.k]
        made = [j for j in rest if inputs[j].id is not None and inputs[j].id in self.producer]
        act = next((j for j in fits if j in made), fits[0] if fits else (made[0] if made else None))
        return act, [j for j in rest if j != act], biases

    def _gemm(self, op: Gemm, inputs: list[TensorSpec]) -> OpBase:
        rule = linear_style(op, self.rules)
        tp = self.tp
        split_in = [s for s in inputs if isinstance(self._state(s), _Split)]
        if rule is None or rule.style is ParallelStyle.REPLICATED:
            if rule is None and op.batch > 1 and split_in:
                return self._batched(op, inputs)
            if rule is None:
                self.unknown.append(op)
            return self._replicated(op, inputs)
        act, weights, biases = self._gemm_roles(op, inputs)
        ep = self.expert_parallel and rule.moe_experts and op.groups > 1
        new_in = list(inputs)
        if ep:
            return self._expert_parallel(op, rule, new_in, act)
        if rule.style in (ParallelStyle.COLUMN, ParallelStyle.VOCAB):
            vocab = rule.style is ParallelStyle.VOCAB
            if vocab and self.lm_head == "replicated":
                return self._replicated(op, inputs)
            f = self.ctx.kv_factor.get(op.id, tp)
            if op.n % f and not vocab:
                raise self._fail(op, "n (output features)", op.n, f)
            new_n = -(-op.n // f)
            if vocab and op.n % f:
                self.notes.append(
                    f"tensor parallel: the vocabulary of op {op.id} ({op.n}) is padded to {new_n * f} for tp={f}"
                )
            if act is not None:
                new_in[act] = self._whole(op, new_in[act])
            for j in (*weights, *biases):
                d = self._dim_of_size(new_in[j].shape, op.n, prefer_last=True)
                if d is not None:
                    new_in[j] = _reshard(new_in[j], d, f, ceil=vocab)
            outs: list[TensorSpec] = []
            states: list[_State] = []
            for t in op.outputs:
                d = self._dim_of_size(t.shape, op.n, prefer_last=True)
                if d is None:
                    outs.append(t)
                    states.append(None)
                    continue
                local = _reshard(t, d, f, ceil=vocab)
                outs.append(local)
                states.append(_Split(f, math.prod(t.shape[d:]), t, local) if f > 1 else None)
            self.counts["column"] += 1
            new = self._rebuild(op, new_in, outs, n=new_n)
            self._set_outputs(op.outputs, states)
            if vocab:
                # Logits are gathered right away: sampling and every later reader need all of them.
                for t in op.outputs:
                    if t.id is not None and t.id in self.state:
                        self.producer[t.id] = new
                        self._emit_collective(CollectiveKind.ALL_GATHER, t.id, op)
                        self.force.add(t.id)
            return new
        # Row-parallel: the input features are split; each rank computes a partial sum.
        if op.k % tp:
            raise self._fail(op, "k (input features)", op.k, tp)
        if act is not None:
            st = self._state(new_in[act])
            if isinstance(st, _Partial) or (isinstance(st, _Split) and st.factor != tp):
                new_in[act] = self._whole(op, new_in[act])
                st = None
            shape = new_in[act].shape
            if shape and shape[-1] == op.k:
                d = len(shape) - 1
            else:
                d = self._pick_dim(shape, tp, st.block if isinstance(st, _Split) else op.k, set())
            if d is not None:
                new_in[act] = _reshard(new_in[act], d, tp)
        for j in weights:
            d = self._dim_of_size(new_in[j].shape, op.k, prefer_last=False)
            if d is not None:
                new_in[j] = _reshard(new_in[j], d, tp)
        self.counts["row"] += 1
        new = self._rebuild(op, new_in, op.outputs, k=op.k // tp)
        self._set_outputs(op.outputs, [_Partial(t) for t in op.outputs])
        return new

    @staticmethod
    def _dim_of_size(shape: Sequence[int], size: int, *, prefer_last: bool) -> int | None:
        """The dimension of ``shape`` of the given size: last first, or second-to-last first."""
        rank = len(shape)
        order = list(reversed(range(rank)))
        if not prefer_last and rank >= 2:
            order = [rank - 2, rank - 1, *range(rank - 3, -1, -1)]
        return next((d for d in order if shape[d] == size), None)

    def _batched(self, op: Gemm, inputs: list[TensorSpec]) -> OpBase:
        """A per-head batched GEMM (eager attention) on split inputs: ``batch / f``."""
        st = next(s for s in (self._state(t) for t in inputs) if isinstance(s, _Split))
        f = st.factor
        if op.batch % f:
            return self._replicated(op, inputs)
        new_in = [self._whole(op, s) if isinstance(self._state(s), _Partial) else s for s in inputs]
        new_in = [_reshard(s, 0, f) if s.shape and s.shape[0] % f == 0 else s for s in new_in]
        outs = [_reshard(t, 0, f) if t.shape and t.shape[0] % f == 0 else t for t in op.outputs]
        self._set_outputs(
            op.outputs,
            [_Split(f, math.prod(t.shape), t, o) if t != o else None for t, o in zip(op.outputs, outs, strict=True)],
        )
        return self._rebuild(op, new_in, outs, batch=op.batch // f)

    def _expert_parallel(self, op: Gemm, rule: LinearRule, inputs: list[TensorSpec], act: int | None) -> OpBase:
        """Stacked experts split by expert: each rank runs ``groups / tp`` of them."""
        tp = self.tp
        if op.groups % tp:
            raise self._fail(
                op,
                "groups (active experts)",
                op.groups,
                tp,
                hint="choose a tp that divides them, or no expert parallelism",
            )
        new_in: list[TensorSpec] = []
        for s in inputs:
            if isinstance(self._state(s), _Partial):
                s = self._whole(op, s)
            new_in.append(_reshard(s, 0, tp) if len(s.shape) >= 2 and s.shape[0] == op.groups else s)
        outs = [_reshard(t, 0, tp) if t.shape and t.shape[0] == op.groups else t for t in op.outputs]
        if rule.style is ParallelStyle.ROW:
            states: list[_State] = [_Partial(o) for o in outs]
        else:
            states = [
                _Split(tp, math.prod(t.shape), t, o) if t != o else None for t, o in zip(op.outputs, outs, strict=True)
            ]
        self._set_outputs(op.outputs, states)
        self.counts["column" if rule.style is not ParallelStyle.ROW else "row"] += 1
        return self._rebuild(op, new_in, outs, groups=op.groups // tp)

    # ------------------------------------------------------------ attention
    def _head_dim(self, shape: Sequence[int], heads: Sequence[int], factor: int) -> int | None:
        """Head dimension of an attention tensor: dim 1 of [b, h, s, d], dim 0 of [b*h, s, d]."""
        rank = len(shape)
        order = [1, 2] if rank >= 4 else [0, 1] if rank == 3 else list(range(rank))
        for d in order:
            if d < rank and shape[d] in heads and shape[d] % factor == 0 and shape[d] > 1:
                return d
        return None

    def _attention(self, op: Attention, inputs: list[TensorSpec]) -> OpBase:
        # The query is the split input of the query's size (eager attention passes ALiBi or a
        # mask first); without a split query the attention stays whole.
        splits = [j for j, t in enumerate(inputs) if isinstance(self._state(t), _Split)]
        q_numel = op.batch * op.q_len * op.heads * op.head_dim
        qi = next((j for j in splits if inputs[j].numel == q_numel), splits[0] if splits else None)
        if qi is None:
            return self._replicated(op, inputs)
        q_state = self._state(inputs[qi])
        assert isinstance(q_state, _Split)
        fq = q_state.factor
        kv_states = [s for s in (self._state(inputs[j]) for j in splits if j != qi) if isinstance(s, _Split)]
        fkv = kv_states[0].factor if kv_states else 1
        heads, kv_heads = op.heads // fq, max(1, op.kv_heads // fkv)
        if heads % kv_heads:
            raise TensorParallelError(
                f"{_op_name(op)}: {heads} query heads per rank do not group over {kv_heads} KV heads (tp={self.tp})",
                where=f"op {op.id}",
            )
        b = op.batch
        q_sizes = (op.heads, b * op.heads)
        kv_sizes = (op.kv_heads, b * op.kv_heads)
        new_in: list[TensorSpec] = []
        for j, s in enumerate(inputs):
            st = self._state(s)
            if isinstance(st, _Partial):
                s, st = self._whole(op, s), None
            if isinstance(st, _Split):
                sizes = q_sizes if j == qi else (*kv_sizes, *q_sizes)
                d = self._head_dim(s.shape, sizes, st.factor)
                if d is None:
                    d = self._pick_dim(s.shape, st.factor, st.block, {op.heads, op.kv_heads})
                if d is None:
                    new_in.append(self._whole(op, s))
                    continue
                new_in.append(_reshard(s, d, st.factor))
                continue
            # Replicated per-head inputs (sinks, ALiBi slopes, a KV cache passed in): each rank its slice.
            d = self._head_dim(s.shape, q_sizes, fq)
            if d is not None and len(s.shape) >= 3:
                new_in.append(_reshard(s, d, fq))
                continue
            d = self._head_dim(s.shape, kv_sizes, fkv) if fkv > 1 else None
            if d is not None and len(s.shape) >= 3 and s.id not in self.producer:
                new_in.append(_reshard(s, d, fkv))
                continue
            new_in.append(s)
        outs: list[TensorSpec] = []
        states: list[_State] = []
        for t in op.outputs:
            d = self._head_dim(t.shape, q_sizes, fq)
            if d is None:
                d = self._pick_dim(t.shape, fq, None, {op.heads})
            if d is None:
                outs.append(t)
                states.append(None)
                continue
            local = _reshard(t, d, fq)
            outs.append(local)
            states.append(_Split(fq, math.prod(t.shape[d:]), t, local))
        self._set_outputs(op.outputs, states)
        return self._rebuild(op, new_in, outs, heads=heads, kv_heads=kv_heads)

    # ------------------------------------------------------------ embedding, MoE routing
    def _embedding(self, op: Embedding, inputs: list[TensorSpec]) -> OpBase:
        if self.embedding == "replicated":
            return self._replicated(op, inputs)
        tp = self.tp
        new_in = self._all_whole(op, inputs)
        for j, s in enumerate(new_in):
            if s.shape and s.shape[0] == op.vocab and len(s.shape) == 2:
                new_in[j] = _reshard(s, 0, tp, ceil=True)
        vocab = -(-op.vocab // tp)
        if op.vocab % tp:
            self.notes.append(
                f"tensor parallel: the vocabulary of op {op.id} ({op.vocab}) is padded to {vocab * tp} for tp={tp}"
            )
        self._set_outputs(op.outputs, [_Partial(t) for t in op.outputs])
        return self._rebuild(op, new_in, op.outputs, vocab=vocab)

    def _moe_routing(self, op: MoeRouting, inputs: list[TensorSpec]) -> OpBase:
        if op.fn != "combine" or not any(isinstance(self._state(s), _Partial) for s in inputs):
            return self._replicated(op, inputs)
        # The weighted sum of partial expert outputs is itself partial: reduce once, after it.
        new_in = [self._whole(op, s) if isinstance(self._state(s), _Split) else s for s in inputs]
        self._set_outputs(op.outputs, [_Partial(t) for t in op.outputs])
        return self._rebuild(op, new_in, op.outputs)

    # ------------------------------------------------------------ pointwise
    def _keeps_partial(self, op: OpBase, inputs: Sequence[TensorSpec]) -> bool:
        """Whether ``op`` is linear in its partial inputs, so its output is partial too."""
        parts = [isinstance(self._state(s), _Partial) for s in inputs]
        if not any(parts) or any(isinstance(self._state(s), _Split) for s in inputs):
            return False
        if isinstance(op, View):
            return True
        if isinstance(op, Memory):
            return op.fn in _LINEAR_PROPAGATING and sum(parts) == 1
        if isinstance(op, Elementwise):
            tensors = [p for p, s in zip(parts, inputs, strict=True) if s.numel > 1]
            if op.fn in ("add", "sub"):
                return bool(tensors) and all(tensors)
            if op.fn in ("mul", "neg") or (op.fn == "div" and parts[0]):
                return sum(parts) == 1
        return False

    def _pointwise(self, op: OpBase, inputs: list[TensorSpec]) -> OpBase:
        if self._keeps_partial(op, inputs):
            self._set_outputs(op.outputs, [_Partial(t) for t in op.outputs])
            return self._rebuild(op, inputs, op.outputs)
        inputs = [self._whole(op, s) if isinstance(self._state(s), _Partial) else s for s in inputs]
        primary = next((j for j, s in enumerate(inputs) if isinstance(self._state(s), _Split)), None)
        if primary is None:
            self._set_outputs(op.outputs, None)
            return self._rebuild(op, inputs, op.outputs)
        st = self._state(inputs[primary])
        assert isinstance(st, _Split)
        f = st.factor
        hints = self._hints(op) | ({op.heads} if isinstance(op, Rope) else set())
        shape = inputs[primary].shape
        d = self._pick_dim(shape, f, st.block, hints, inputs[primary].strides)
        if d is None:
            return self._replicated(op, inputs)
        new_in: list[TensorSpec] = []
        for j, s in enumerate(inputs):
            sj = self._state(s)
            if j == primary:
                new_in.append(_reshard(s, d, f))
            elif isinstance(sj, _Split):
                dj = self._pick_dim(s.shape, sj.factor, sj.block, hints, s.strides)
                new_in.append(_reshard(s, dj, sj.factor) if dj is not None else self._whole(op, s))
            elif len(s.shape) == len(shape) and s.shape[d] == shape[d] and s.shape[d] > 1:
                new_in.append(_reshard(s, d, f))  # a local slice of a whole tensor, no communication
            else:
                new_in.append(s)
        outs: list[TensorSpec] = []
        states: list[_State] = []
        for t in op.outputs:
            if len(t.shape) == len(shape) and t.shape[d] == shape[d]:
                dt: int | None = d
            elif isinstance(op, Reduction):
                dt = None  # it may reduce over the split dimension: read it whole
            else:
                dt = self._pick_dim(t.shape, f, None, hints)
            if dt is None:
                return self._replicated(op, inputs)
            local = _reshard(t, dt, f)
            outs.append(local)
            states.append(_Split(f, math.prod(t.shape[dt:]), t, local))
        fields = self._pointwise_fields(op, f, d, shape, outs)
        if fields is None:
            return self._replicated(op, inputs)
        self._set_outputs(op.outputs, states)
        return self._rebuild(op, new_in, outs, **fields)

    def _pointwise_fields(
        self, op: OpBase, f: int, d: int, shape: Sequence[int], outs: Sequence[TensorSpec]
    ) -> dict[str, Any] | None:
        """The kind fields of a pointwise op whose tensors shrank by ``f``; None if it cannot split."""
        last = d == len(shape) - 1

        def div(v: int) -> int:
            return v // f if v % f == 0 else max(1, round(v / f))

        def hidden_of(h: int) -> int:
            if outs and outs[0].shape and last and h > 1:
                return outs[0].shape[-1]
            return h

        if isinstance(op, (Elementwise, Activation)):
            return {"numel": div(op.numel), "hidden": hidden_of(op.hidden)}
        if isinstance(op, Memory):
            return {"numel": div(op.numel)}
        if isinstance(op, View):
            return {}
        if isinstance(op, Rope):
            if op.heads % f:
                return None
            return {"heads": op.heads // f}
        if isinstance(op, Norm):
            if last and shape[d] == op.hidden:
                self.notes.append(
                    "tensor parallel: a norm over split features is computed per rank; the all-reduce of its "
                    "statistics (a few bytes per row) is not modelled"
                )
                return {"hidden": op.hidden // f}
            return {"rows": div(op.rows)}
        if isinstance(op, Softmax):
            if last:
                return None
            return {"rows": div(op.rows)}
        if isinstance(op, Reduction):
            return {"numel_in": div(op.numel_in), "numel_out": div(op.numel_out)}
        return None


def shard_tensor_parallel(
    graph: OpGraph,
    tp: int,
    *,
    rules: Sequence[LinearRule] = DEFAULT_LINEAR_RULES,
    embedding: Literal["vocab_parallel", "replicated"] = "vocab_parallel",
    lm_head: Literal["vocab_parallel", "replicated"] = "vocab_parallel",
    expert_parallel: bool = False,
) -> OpGraph:
    """The graph one rank of a ``tp``-way Megatron-style tensor-parallel run executes.

    Parameters
    ----------
    graph:
        A captured (unsharded) graph; it must contain no collectives yet.
    tp:
        Tensor-parallel degree (1 returns the graph with ``capture["tp"] = 1``).
    rules:
        Scope rules that say which GEMMs are column- or row-parallel (:data:`DEFAULT_LINEAR_RULES`).
    embedding, lm_head:
        ``vocab_parallel`` (split over the vocabulary, with an all-reduce / all-gather) or
        ``replicated``.
    expert_parallel:
        Split stacked MoE experts by expert (``groups / tp``) instead of inside each expert.

    Raises
    ------
    TensorParallelError
        ``tp < 1``, a graph that already has collectives, or a dimension that ``tp`` does not
        divide (the message names the op and the dimension).

    Examples
    --------
    >>> from opgraph.ir import Gemm, OpGraph, TensorSpec, DType
    >>> x = TensorSpec(shape=(8, 4096), dtype=DType.bf16, id=0)
    >>> w = TensorSpec(shape=(4096, 4096), dtype=DType.bf16, id=1)
    >>> y = TensorSpec(shape=(8, 4096), dtype=DType.bf16, id=2)
    >>> g = OpGraph(ops=(Gemm(id=0, m=8, n=4096, k=4096, inputs=(x, w), outputs=(y,), scope="mlp.down_proj"),))
    >>> s = shard_tensor_parallel(g, 2)
    >>> [(o.kind.value, getattr(o, "k", None)) for o in s.ops]
    [('gemm', 2048), ('collective', None)]
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise TensorParallelError(f"tp must be 1 or more, got {tp!r}", where="tp", hint="give the number of ranks")
    if embedding not in ("vocab_parallel", "replicated"):
        raise TensorParallelError(
            f"unknown embedding mode {embedding!r}", where="embedding", hint="vocab_parallel or replicated"
        )
    if lm_head not in ("vocab_parallel", "replicated"):
        raise TensorParallelError(
            f"unknown lm_head mode {lm_head!r}", where="lm_head", hint="vocab_parallel or replicated"
        )
    sharded = graph.metadata.capture.get("tp")
    if isinstance(sharded, int) and sharded > 1:
        raise TensorParallelError(
            f"the graph is already sharded for tp={sharded}", where="graph", hint="shard the unsharded capture"
        )
    colls = graph.ops_of(OpKind.COLLECTIVE)
    if colls and tp > 1:
        raise TensorParallelError(
            f"the graph already has {len(colls)} collective op(s) (op {colls[0].id}): it is a per-rank graph",
            where="graph",
            hint="simulate it with --tp as it is (opgraph simulate --no-shard)",
        )
    if tp == 1:
        md = graph.metadata
        return graph.model_copy(update={"metadata": md.model_copy(update={"capture": {**md.capture, "tp": 1}})})
    graph.lint()
    return _Sharder(graph, tp, rules, embedding, lm_head, expert_parallel).run()
