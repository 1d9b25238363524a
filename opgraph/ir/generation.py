"""Generation plans: a long generate graph as recorded steps plus one decode-step template.

A ``generate`` graph of ``N`` decode steps repeats the same decode step ``N`` times; only what depends
on the KV length changes from step to step (the KV-cache ``cat`` sizes, the attention's ``kv_len``,
the position argument of an ``add``), and op ids and tensor ids advance by a constant per step.
Materialising every op of a 1,024-step generation of a 70B model (two million validated ops) costs
minutes and gigabytes, so a graph may hold a :class:`GenerationPlan` instead:

* the graph's explicit ops and edges are the recorded steps (the prefill, step 0, and the first
  decode steps up to ``base_step``);
* :attr:`GenerationPlan.ops` are the ops of decode step ``base_step`` (typed, validated), and
  :attr:`GenerationPlan.edges` the edges into that step, in the graph's edge order;
* step ``k`` (``first_step`` .. ``last_step``) is the template with

  - its op ids advanced by ``(k - base_step) * op_shift``, and every edge end at or above
    ``op_floor`` likewise (an edge from an op below ``op_floor`` -- the prefill -- keeps its source);
  - every tensor id at or above ``tensor_floor`` advanced by ``(k - base_step) * tensor_shift``
    (tensors below it -- weights, buffers, what the prefill made -- are the same in every step);
  - each :class:`FieldDelta` (a KV length, a shape dimension, a call argument) advanced by
    ``(k - base_step) * per_step``;
  - the cost fields named by :attr:`Rederived` (``flops``, ``bytes_read``, ``bytes_written``,
    ``definition``) derived again by the op's own model (``default_flops``, ``default_bytes``,
    ``default_definition``) from the advanced fields, so that the costs of step ``k`` are those its
    op model gives, not an extrapolation;
  - and, in the last step only, the ops of :attr:`final_drop` and their edges left out (a tail the
    last step does not run; captures keep the last step's sampler, as ``generate`` samples after its
    last forward pass too, so theirs is empty).

Capture builds a plan only after checking it (:mod:`opgraph.capture.generation`); a plan's step
equals the step a full recording would give, op for op. Graph consumers need not know: ``graph.ops``
and ``graph.edges`` of a planned graph are lazy sequences (:class:`LazyOps`, :class:`LazyEdges`)
that build a step's ops when read; :meth:`GenerationPlan.step_ops` builds one step, and
:meth:`GenerationPlan.step_costs` the (cached) per-op costs of a step without building its ops, for
code (summaries, simulators) that only needs costs. Saved, a planned graph is the explicit ops and
edges plus the plan (``schema_version`` 2); graphs without a plan are saved as before (version 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any, ClassVar, Generic, Literal, TypeVar, overload

from pydantic import BaseModel, model_validator

from opgraph.ir.gcpause import paused_gc
from opgraph.ir.ops import OP_TYPES, Op, OpBase, PosInt
from opgraph.ir.tensor import FrozenModel, NonNegInt, TensorSpec

SAMPLER_SCOPE = "sampler"
"""Scope of the ops a generate graph's loop runs after each forward pass (picking the next token, the
stopping criteria, the next inputs): the tail of every step."""
DERIVED_FIELDS: tuple[str, ...] = ("flops", "bytes_read", "bytes_written", "definition")
"""Op fields an op model derives from its other fields (re-derived per step by a plan)."""

Path = tuple[str | int, ...]
"""Where a value sits in an op's dump: ``("kv_len",)``, ``("inputs", 0, "shape", 2)``."""


class FieldDelta(FrozenModel):
    """A value of a template op that changes by a constant from one decode step to the next."""

    op: NonNegInt
    """Index of the op in the template."""
    path: tuple[str | int, ...]
    """Where the value sits in the op's dump (``("kv_len",)``, ``("inputs", 0, "shape", 2)``)."""
    per_step: int
    """Change per step."""


class Rederived(FrozenModel):
    """Cost fields of a template op that its model derives again at every step."""

    op: NonNegInt
    """Index of the op in the template."""
    fields: tuple[str, ...]
    """Some of ``flops``, ``bytes_read``, ``bytes_written``, ``definition``."""


class EdgeTemplate(FrozenModel):
    """An edge into the template step (``dst`` in the step; ``src`` in it, the step before, or earlier)."""

    src: NonNegInt
    """Id of the producing op (advanced per step when at or above the plan's ``op_floor``)."""
    dst: NonNegInt
    """Id of the consuming op, in the template step."""
    kind: Literal["data", "order"] = "data"
    """An :class:`~opgraph.ir.graph.EdgeKind` value."""
    tensor: int | None = None
    """Id of the tensor that flows (advanced per step when at or above the plan's ``tensor_floor``)."""


StepCost = tuple[int, int, int, str]
"""``(flops, bytes_read, bytes_written, definition)`` of one op at one step."""


class GenerationPlan(FrozenModel):
    """Decode steps ``first_step`` .. ``last_step`` of a generate graph, built from one template step."""

    base_step: PosInt
    """The decode step whose recorded ops are the template."""
    first_step: PosInt
    """First step built from the template (``base_step + 1``)."""
    last_step: PosInt
    """Last decode step of the generation (the graph's ``new_tokens``)."""
    ops: tuple[Op, ...]
    """The ops of step ``base_step``, in program order (ids contiguous)."""
    edges: tuple[EdgeTemplate, ...] = ()
    """The edges into step ``base_step``, in graph order."""
    op_shift: PosInt
    """Op ids a step advances by (the template's op count)."""
    op_floor: NonNegInt
    """Op ids below this (the prefill's) are the same in every step."""
    tensor_shift: NonNegInt
    """Tensor ids a step advances by."""
    tensor_floor: NonNegInt
    """Tensor ids below this (weights, buffers, the prefill's tensors) are the same in every step."""
    deltas: tuple[FieldDelta, ...] = ()
    """Values that change by a constant per step (KV lengths, shapes, call arguments)."""
    rederived: tuple[Rederived, ...] = ()
    """Cost fields derived again per step by the op's model."""
    final_drop: tuple[NonNegInt, ...] = ()
    """Template ops (a tail: the sampler) the last step does not have."""

    @model_validator(mode="after")
    def _check(self) -> GenerationPlan:
        n = len(self.ops)
        if not self.ops:
            raise ValueError("a generation plan needs the template's ops")
        if self.first_step != self.base_step + 1:
            raise ValueError(f"first_step ({self.first_step}) must follow base_step ({self.base_step})")
        if self.last_step < self.first_step:
            raise ValueError(f"last_step ({self.last_step}) is before first_step ({self.first_step})")
        first = self.ops[0].id
        if any(o.id != first + j for j, o in enumerate(self.ops)):
            raise ValueError("template op ids must be contiguous")
        if self.op_shift != n:
            raise ValueError(f"op_shift ({self.op_shift}) must equal the template's op count ({n})")
        if self.op_floor > first:
            raise ValueError(f"op_floor ({self.op_floor}) is above the template's first op id ({first})")
        for index in (*(d.op for d in self.deltas), *(r.op for r in self.rederived)):
            if index >= n:
                raise ValueError(f"op index {index} is outside the template ({n} ops)")
        if self.final_drop and tuple(self.final_drop) != tuple(range(n - len(self.final_drop), n)):
            raise ValueError("final_drop must be the template's last ops")
        for e in self.edges:
            if not first <= e.dst < first + n:
                raise ValueError(f"template edge {e.src}->{e.dst} does not end in the template step")
            if e.src >= e.dst:
                raise ValueError(f"template edge {e.src}->{e.dst} does not go forward")
        return self

    # ----------------------------------------------------------------- sizes and ids
    @property
    def steps(self) -> range:
        """The steps this plan builds."""
        return range(self.first_step, self.last_step + 1)

    def step_len(self, step: int) -> int:
        """Ops in ``step`` (the last step lacks :attr:`final_drop`)."""
        return self.op_shift - (len(self.final_drop) if step == self.last_step else 0)

    @property
    def num_ops(self) -> int:
        """Ops of every step the plan builds."""
        return self.op_shift * len(self.steps) - len(self.final_drop)

    @cached_property
    def _edges_final(self) -> tuple[int, ...]:
        # Indices of the template edges the last step keeps.
        dropped = {self.ops[j].id for j in self.final_drop}
        return tuple(i for i, e in enumerate(self.edges) if e.dst not in dropped and e.src not in dropped)

    def step_edge_count(self, step: int) -> int:
        """Edges into ``step``."""
        return len(self._edges_final) if step == self.last_step else len(self.edges)

    @property
    def num_edges(self) -> int:
        """Edges into every step the plan builds."""
        return len(self.edges) * (len(self.steps) - 1) + len(self._edges_final)

    def first_id(self, step: int) -> int:
        """Id of the first op of ``step``."""
        return self.ops[0].id + (step - self.base_step) * self.op_shift

    def _op_id(self, op_id: int, k: int) -> int:
        return op_id + k * self.op_shift if op_id >= self.op_floor else op_id

    def _tensor_id(self, tid: int | None, k: int) -> int | None:
        return tid + k * self.tensor_shift if tid is not None and tid >= self.tensor_floor else tid

    # ----------------------------------------------------------------- building ops
    @cached_property
    def _deltas_by_op(self) -> dict[int, list[FieldDelta]]:
        out: dict[int, list[FieldDelta]] = {}
        for d in self.deltas:
            out.setdefault(d.op, []).append(d)
        return out

    @cached_property
    def _rederived_by_op(self) -> dict[int, tuple[str, ...]]:
        return {r.op: r.fields for r in self.rederived}

    @cached_property
    def _dumps(self) -> tuple[dict[str, Any], ...]:
        return tuple(o.model_dump() for o in self.ops)

    def _fields(self, j: int, k: int) -> dict[str, Any]:
        """The dump of template op ``j`` with its deltas advanced ``k`` steps (ids untouched)."""
        data = dict(self._dumps[j])
        for d in self._deltas_by_op.get(j, ()):
            _add_at(data, d.path, d.per_step * k)
        for name in self._rederived_by_op.get(j, ()):
            data.pop(name, None)
        return data

    def _varying(self, j: int) -> bool:
        return j in self._deltas_by_op or j in self._rederived_by_op

    @cached_property
    def _signature(self) -> tuple[int, ...]:
        # Ops that cost the same at every step (same fields but for where they ran) share a signature.
        sig: dict[object, int] = {}
        out: list[int] = []
        for j, dump in enumerate(self._dumps):
            if not self._varying(j):
                out.append(-1)
                continue
            key = repr(
                (
                    {k: v for k, v in dump.items() if k not in ("id", "scope", "layer", "step", "inputs", "outputs")},
                    [(t["shape"], t["dtype"], t["strides"]) for t in dump["inputs"]],
                    [(t["shape"], t["dtype"], t["strides"]) for t in dump["outputs"]],
                    [(d.path, d.per_step) for d in self._deltas_by_op.get(j, ())],
                    self._rederived_by_op.get(j, ()),
                    j in self.final_drop,
                )
            )
            out.append(sig.setdefault(key, len(sig)))
        return tuple(out)

    def _costed(self, j: int, step: int) -> OpBase:
        """Template op ``j`` at ``step`` with the template's ids (its costs are the step's)."""
        k = step - self.base_step
        return OP_TYPES[self.ops[j].kind].model_validate(self._fields(j, k))

    def step_costs(self, step: int) -> list[StepCost]:
        """``(flops, bytes_read, bytes_written, definition)`` of every op of ``step``, in order.

        Ops whose fields do not change share the template's costs; the others are derived once per
        step for each group of ops with equal fields (every layer's attention costs the same).
        """
        if step not in self.steps:
            raise IndexError(f"step {step} is not built by this plan ({self.first_step}..{self.last_step})")
        cache: dict[int, StepCost] = {}
        out: list[StepCost] = []
        sigs = self._signature
        for j in range(self.step_len(step)):
            s = sigs[j]
            if s < 0:
                o = self.ops[j]
                out.append((o.flops, o.bytes_read, o.bytes_written, o.definition))
                continue
            cost = cache.get(s)
            if cost is None:
                cost = cache[s] = self._cost_of(j, step)
            out.append(cost)
        return out

    def cost_totals(self) -> list[tuple[int, int, int]]:
        """``(steps, flops, bytes)`` of each template op summed over every step the plan builds.

        Costs that change are derived once per step for each group of equal ops, not per op.
        """
        steps = self.steps
        present = [len(steps) - (1 if j in self.final_drop else 0) for j in range(len(self.ops))]
        sigs = self._signature
        reps: dict[int, int] = {}
        for j, s in enumerate(sigs):
            if s >= 0:
                reps.setdefault(s, j)
        by_sig: dict[int, tuple[int, int]] = {}
        for s, j in reps.items():
            flops = nbytes = 0
            for step in steps:
                if step == self.last_step and j in self.final_drop:
                    continue
                o = self._costed(j, step)
                flops += o.flops
                nbytes += o.total_bytes
            by_sig[s] = (flops, nbytes)
        out: list[tuple[int, int, int]] = []
        for j, o in enumerate(self.ops):
            s = sigs[j]
            if s < 0:
                out.append((present[j], o.flops * present[j], o.total_bytes * present[j]))
            else:
                out.append((present[j], *by_sig[s]))
        return out

    def step_ops(self, step: int) -> list[OpBase]:
        """The ops of ``step`` (validated models, equal to a recording's)."""
        if step not in self.steps:
            raise IndexError(f"step {step} is not built by this plan ({self.first_step}..{self.last_step})")
        memo: dict[object, TensorSpec] = {}
        with paused_gc():  # thousands of new objects, none cyclic: collections would only cost time
            return [self._op_at(j, step, memo) for j in range(self.step_len(step))]

    def step_op(self, step: int, j: int) -> OpBase:
        """Op ``j`` of the template as ``step`` has it (what ``step_ops(step)[j]`` holds)."""
        if step not in self.steps or not 0 <= j < self.step_len(step):
            raise IndexError(f"op {j} of step {step} is not built by this plan")
        return self._op_at(j, step)

    def _op_at(self, j: int, step: int, memo: dict[object, TensorSpec] | None = None) -> OpBase:
        # Built from the validated template without validating again: ids and tensor ids advanced,
        # deltas applied, and re-derived costs taken from the op model (once per group of equal ops).
        k = step - self.base_step
        op = self.ops[j]
        memo = {} if memo is None else memo
        changes: dict[str, Any] = {
            "id": op.id + k * self.op_shift,
            "step": step,
            "inputs": tuple(self._spec(t, k, memo) for t in op.inputs),
            "outputs": tuple(self._spec(t, k, memo) for t in op.outputs),
        }
        new = _copy(op, changes)
        if not self._varying(j):
            return new
        for d in self._deltas_by_op.get(j, ()):
            new = _add_to(new, d.path, d.per_step * k)
        fields = self._rederived_by_op.get(j, ())
        if fields:
            flops, read, written, definition = self._cost_of(j, step)
            derived = {"flops": flops, "bytes_read": read, "bytes_written": written, "definition": definition}
            new.__dict__.update({f: derived[f] for f in fields})
        return new

    def _cost_of(self, j: int, step: int) -> StepCost:
        key = (self._signature[j], step)
        cost = self._costs.get(key)
        if cost is None:
            c = self._costed(j, step)
            cost = self._costs[key] = (c.flops, c.bytes_read, c.bytes_written, c.definition)
        return cost

    @cached_property
    def _costs(self) -> dict[tuple[int, int], StepCost]:
        return {}

    def _spec(self, t: TensorSpec, k: int, memo: dict[object, TensorSpec]) -> TensorSpec:
        if t.id is None or t.id < self.tensor_floor or k == 0:
            return t
        key = (t.id, t.shape, t.dtype, t.strides)
        spec = memo.get(key)
        if spec is None:
            spec = memo[key] = _copy(t, {"id": t.id + k * self.tensor_shift})
        return spec

    def window(self, first: int, last: int) -> tuple[list[OpBase], list[tuple[int, int, str, int | None]]]:
        """Ops and edges of the consecutive steps ``first``..``last`` alone (edges from outside dropped).

        Steps before :attr:`first_step` (down to 1) are built from the template as well, by the same
        rules: what a simulation of a few steps at a given point of the generation needs.
        """
        if not 1 <= first <= last <= self.last_step:
            raise IndexError(f"steps {first}..{last} are outside 1..{self.last_step}")
        ops: list[OpBase] = []
        edges: list[tuple[int, int, str, int | None]] = []
        for step in range(first, last + 1):
            memo: dict[object, TensorSpec] = {}
            with paused_gc():
                ops.extend(self._op_at(j, step, memo) for j in range(self.step_len(step)))
            edges.extend(e for e in self.step_edges(step) if e[0] >= self.first_id(first))
        return ops, edges

    def step_edges(self, step: int) -> list[tuple[int, int, str, int | None]]:
        """``(src, dst, kind, tensor)`` of the edges into ``step``, in graph order."""
        k = step - self.base_step
        keep = self._edges_final if step == self.last_step else range(len(self.edges))
        out: list[tuple[int, int, str, int | None]] = []
        for i in keep:
            e = self.edges[i]
            out.append((self._op_id(e.src, k), e.dst + k * self.op_shift, e.kind, self._tensor_id(e.tensor, k)))
        return out


M = TypeVar("M", bound=BaseModel)
_T = TypeVar("_T")


def _copy(obj: M, changes: dict[str, Any]) -> M:
    """``obj`` with ``changes`` to its fields, not validated (the values come from validated models)."""
    new = object.__new__(type(obj))
    data = obj.__dict__.copy()
    data.update(changes)
    object.__setattr__(new, "__dict__", data)
    object.__setattr__(new, "__pydantic_fields_set__", obj.__pydantic_fields_set__)
    object.__setattr__(new, "__pydantic_extra__", obj.__pydantic_extra__)
    object.__setattr__(new, "__pydantic_private__", obj.__pydantic_private__)
    return new


def _add_to(node: Any, path: Path, amount: int) -> Any:
    """``node`` (a model, tuple, list or dict) with ``amount`` added to the int at ``path``, copied on the way."""
    if not path:
        return node + amount
    key = path[0]
    if isinstance(node, BaseModel):
        assert isinstance(key, str)
        return _copy(node, {key: _add_to(getattr(node, key), path[1:], amount)})
    if isinstance(node, dict):
        return {**node, key: _add_to(node[key], path[1:], amount)}
    assert isinstance(key, int)
    items = list(node)
    items[key] = _add_to(items[key], path[1:], amount)
    return tuple(items) if isinstance(node, tuple) else items


def _add_at(data: dict[str, Any], path: Path, amount: int) -> None:
    """Add ``amount`` to the int at ``path`` of ``data``, copying the containers on the way."""
    node: Any = data
    for key in path[:-1]:
        child = node[key]
        child = dict(child) if isinstance(child, dict) else list(child)
        node[key] = child
        node = child
    last = path[-1]
    node[last] = node[last] + amount


class _Planned(Generic[_T]):
    """What the lazy views share: the recorded part and the plan, which together decide equality, and
    indexing (the recorded items first, then the planned part's, which each view builds its own way)."""

    __slots__ = ()
    explicit: tuple[_T, ...]
    plan: GenerationPlan
    _item: ClassVar[str]
    """What an item is, for the out-of-range message (``op``, ``edge``)."""

    def __len__(self) -> int:
        """Recorded plus planned items (each view counts its planned part)."""
        raise NotImplementedError

    def _planned(self, off: int) -> _T:
        """Item ``off`` of the planned part (the items after the explicit ones)."""
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> _T: ...
    @overload
    def __getitem__(self, i: slice) -> list[_T]: ...
    def __getitem__(self, i: int | slice) -> _T | list[_T]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self._item} index out of range")
        if i < len(self.explicit):
            return self.explicit[i]
        return self._planned(i - len(self.explicit))

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            assert isinstance(other, _Planned)  # for mypy: same class
            return self.explicit == other.explicit and self.plan == other.plan
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self.explicit), self.plan.last_step))


class LazyOps(_Planned[OpBase], Sequence[OpBase]):
    """``graph.ops`` of a planned graph: the explicit ops, then each planned step's ops built on demand.

    Reading builds ops (a step at a time, the last one kept); iterate rather than index at random.
    """

    __slots__ = ("_cache", "explicit", "plan")
    _item = "op"

    def __init__(self, explicit: tuple[OpBase, ...], plan: GenerationPlan) -> None:
        self.explicit = explicit
        self.plan = plan
        self._cache: tuple[int, list[OpBase]] | None = None

    def __len__(self) -> int:
        return len(self.explicit) + self.plan.num_ops

    def _step(self, step: int) -> list[OpBase]:
        if self._cache is None or self._cache[0] != step:
            self._cache = (step, self.plan.step_ops(step))
        return self._cache[1]

    def _planned(self, off: int) -> OpBase:
        plan = self.plan
        return self._step(plan.first_step + off // plan.op_shift)[off % plan.op_shift]

    def __iter__(self) -> Iterator[OpBase]:
        yield from self.explicit
        for step in self.plan.steps:
            yield from self.plan.step_ops(step)

    def __repr__(self) -> str:
        return f"LazyOps({len(self.explicit)} recorded + {self.plan.num_ops} planned)"


class LazyEdges(_Planned[Any], Sequence[Any]):
    """``graph.edges`` of a planned graph: the explicit edges, then each planned step's, built on demand."""

    __slots__ = ("explicit", "make", "plan")
    _item = "edge"

    def __init__(self, explicit: tuple[Any, ...], plan: GenerationPlan, make: Any) -> None:
        self.explicit = explicit
        self.plan = plan
        self.make = make
        """Builds an edge from ``(src, dst, kind, tensor)`` (``Edge`` lives in :mod:`opgraph.ir.graph`)."""

    def __len__(self) -> int:
        return len(self.explicit) + self.plan.num_edges

    def __iter__(self) -> Iterator[Any]:
        yield from self.explicit
        for step in self.plan.steps:
            for e in self.plan.step_edges(step):
                yield self.make(*e)

    def _planned(self, off: int) -> Any:
        per = len(self.plan.edges)
        step = self.plan.first_step + off // per if per else self.plan.last_step
        return self.make(*self.plan.step_edges(step)[off % per])

    def __repr__(self) -> str:
        return f"LazyEdges({len(self.explicit)} recorded + {self.plan.num_edges} planned)"


__all__ = [
    "DERIVED_FIELDS",
    "EdgeTemplate",
    "FieldDelta",
    "GenerationPlan",
    "LazyEdges",
    "LazyOps",
    "Rederived",
    "StepCost",
]
