"""``OpGraph``: typed ops, typed dependency edges, capture metadata, and its structural lint."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
    model_validator,
)

from opgraph.ir.algorithms import find_cycle as find_cycle
from opgraph.ir.errors import CycleError, DanglingEdgeError, DuplicateIdError
from opgraph.ir.generation import GenerationPlan, LazyEdges, LazyOps
from opgraph.ir.ops import Op, OpBase, OpKind, PosInt, Stage
from opgraph.ir.tensor import FrozenModel, NonNegInt

if TYPE_CHECKING:
    import networkx as nx

SCHEMA_VERSION = 1
"""Version of the saved timeline format (and of graphs without a generation plan); bumped on
incompatible changes."""

GRAPH_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
"""Graph format versions this opgraph reads: 1, and 2 for a graph with a :class:`GenerationPlan`
(graphs without one are still written as 1, so older opgraphs read them)."""

Scalar = str | int | float | bool | None
"""A JSON scalar, for settings and attributes."""


class EdgeKind(str, Enum):
    """Why one op must wait for another."""

    DATA = "data"
    """A tensor written by ``src`` is read by ``dst``."""
    ORDER = "order"
    """Program order or a stream/side-effect dependency with no tensor."""


class Edge(FrozenModel):
    """A dependency: ``dst`` may start only after ``src`` ends."""

    src: NonNegInt
    """Id of the producing op."""
    dst: NonNegInt
    """Id of the consuming op."""
    kind: EdgeKind = EdgeKind.DATA
    """Data or order dependency."""
    tensor: int | None = None
    """Id of the tensor that flows, for data edges."""


_HOST_TIMING_KEYS = {
    "host_timing_us": "total_us",
    "host_timing_cpu": "cpu",
    "host_timing_clock_overhead_us": "clock_overhead_us",
    "host_timing_from": "overhead_source",
}
"""Flat keys of graph files written before :class:`HostTimingSummary` -> its fields."""


class HostTimingSummary(FrozenModel):
    """The framework host time measured at capture (``host_timing``): where, how, and in all."""

    total_us: Annotated[float, Field(ge=0)]
    """Host microseconds between ops, summed over the graph (each op's ``host_gap_us``)."""
    cpu: str
    """The capture host's CPU, whose speed the times are."""
    clock_overhead_us: Annotated[float, Field(ge=0)] = 0.0
    """The timer's cost per call, taken off every counted gap."""
    overhead_source: str = ""
    """What timed the calls: ``profiler``, or a Python clock."""


class CaptureSettings(BaseModel):
    """How a graph was captured: the options that shaped it, and the host timing when measured.

    Unset settings are ``None`` and are not saved. Other settings (a hand-written graph's ``seed``,
    a ``moe_routing`` note) are kept as extra scalar fields. For code written against the dict
    this used to be, it also reads as a mapping of the set settings under their flat names
    (``settings["batch"]``, ``settings.get("host_timing_cpu")``, ``{**settings}``).
    """

    model_config = ConfigDict(frozen=True, extra="allow", use_attribute_docstrings=True)
    __pydantic_extra__: dict[str, Scalar] = Field(init=False)

    batch: PosInt | None = None
    """Sequences per forward pass."""
    dtype: str | None = None
    """Compute dtype asked for (``bf16``)."""
    device: str | None = None
    """Where the model ran: ``meta``, ``cpu``, ``cuda`` or ``cuda:N``."""
    attn_impl: str | None = None
    """Attention implementation asked for (``sdpa``, ``eager``)."""
    seq_len: PosInt | None = None
    """Prompt tokens per sequence (prefill, generate)."""
    kv_len: PosInt | None = None
    """Tokens already in the KV cache (decode)."""
    new_tokens: PosInt | None = None
    """Decode steps after the prefill (generate)."""
    layers: PosInt | None = None
    """Layers kept when the capture was cut to fewer than the model has."""
    moe_skew: Annotated[float, Field(ge=0)] | None = None
    """Zipf exponent of the modelled expert loads (absent: balanced)."""
    seed: Annotated[int, Field(ge=0)] | None = None
    """Seed of the random weights a model built on a real device got (absent: meta, a given module, or
    weights loaded from the checkpoint)."""
    weights: str | None = None
    """``checkpoint`` when the model's own weights were loaded (``--weights``); absent: random or none."""
    host_timing: HostTimingSummary | None = None
    """Framework host time between ops, when capture measured it."""
    tp: PosInt | None = None
    """Tensor-parallel degree the graph was sharded for (one rank's graph)."""

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: object) -> object:
        # Graph files before this model kept the host timing as flat host_timing_* keys.
        if isinstance(data, Mapping) and any(k in data for k in _HOST_TIMING_KEYS):
            flat = dict(data)
            flat["host_timing"] = {new: flat.pop(old) for old, new in _HOST_TIMING_KEYS.items() if old in flat}
            return flat
        return data

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        return {k: v for k, v in data.items() if v is not None}

    def flat(self) -> dict[str, Scalar]:
        """The set settings under their flat names (``host_timing_us``, ``host_timing_cpu``...)."""
        out: dict[str, Scalar] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, HostTimingSummary):
                out.update({old: getattr(value, new) for old, new in _HOST_TIMING_KEYS.items()})
            else:
                out[name] = value
        out.update(self.__pydantic_extra__ or {})
        return out

    # Read-only mapping view, for code written against the dict.
    def keys(self) -> list[str]:
        """Names of the set settings (flat)."""
        return list(self.flat())

    def items(self) -> list[tuple[str, Scalar]]:
        """``(name, value)`` of the set settings (flat)."""
        return list(self.flat().items())

    def get(self, key: str, default: Scalar = None) -> Scalar:
        """A setting by its flat name, or ``default``."""
        return self.flat().get(key, default)

    def __getitem__(self, key: str) -> Scalar:
        return self.flat()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.flat()


def capture_settings(value: CaptureSettings | Mapping[str, Scalar]) -> CaptureSettings:
    """``value`` as :class:`CaptureSettings` (a graph's metadata copied with a plain dict holds one)."""
    return value if isinstance(value, CaptureSettings) else CaptureSettings.model_validate(value)


class GraphMetadata(FrozenModel):
    """Where a graph came from and under which assumptions."""

    model: str = ""
    """Model name, preset or path."""
    architecture: str = ""
    """transformers architecture class (``LlamaForCausalLM``)."""
    config_hash: str = ""
    """Stable hash of the model config, to tell graphs of different models apart."""
    num_layers: int | None = None
    """Transformer layers in the captured model."""
    phase: str = ""
    """``prefill``, ``decode``, ``generate`` or ``trace``."""
    capture: CaptureSettings = Field(default_factory=CaptureSettings)
    """Capture settings (batch, seq_len, kv_len, dtype, device, attention implementation, host timing)."""
    versions: dict[str, str] = Field(default_factory=dict)
    """Library versions at capture (torch, transformers, opgraph)."""
    assumptions: tuple[str, ...] = ()
    """Data-dependent values that were assumed rather than computed (MoE routing, ``.item()``)."""

    @property
    def host_timing(self) -> HostTimingSummary | None:
        """The host timing measured at capture, if any."""
        return capture_settings(self.capture).host_timing

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; a ``capture`` given as a plain mapping is validated into
        :class:`CaptureSettings` (``model_copy`` validates nothing else)."""
        if update and "capture" in update and not isinstance(update["capture"], CaptureSettings):
            update = {**update, "capture": capture_settings(update["capture"])}
        return super().model_copy(update=update, deep=deep)


class OpGraph(FrozenModel):
    """A model's ops and their dependencies. The serialised form is this pydantic model.

    A long ``generate`` graph may carry a :class:`~opgraph.ir.generation.GenerationPlan`: its
    ``ops`` and ``edges`` are then lazy sequences (the recorded steps, then each planned step built
    when read) and it is saved compactly, as the recorded ops plus the plan (``schema_version`` 2).
    Code that only needs counts and costs reads :meth:`summary` or the plan's ``step_costs``;
    :meth:`expand` gives the same graph with every op built.
    """

    schema_version: Literal[1, 2] = 1
    """Format version (2: the graph has a generation plan); loaders refuse others with a clear message."""
    metadata: GraphMetadata = Field(default_factory=GraphMetadata)
    """Provenance and settings."""
    ops: tuple[Op, ...] = ()
    """Ops in program order (with a generation plan: the recorded ones, then the planned steps')."""
    edges: tuple[Edge, ...] = ()
    """Dependencies between ops."""
    generation: GenerationPlan | None = None
    """Decode steps built from a template step rather than stored op by op (long generations)."""

    _nx: nx.DiGraph | None = PrivateAttr(default=None)
    _by_id: dict[int, OpBase] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _plan_version(cls, data: object) -> object:
        # A graph given a plan and no version is a version-2 graph.
        if isinstance(data, Mapping) and data.get("generation") is not None and "schema_version" not in data:
            return {**data, "schema_version": 2}
        return data

    @model_validator(mode="after")
    def _install_plan(self) -> OpGraph:
        if self.generation is not None:
            if self.schema_version != 2:
                raise ValueError("a graph with a generation plan has schema_version 2")
            _install_lazy(self)
        return self

    @classmethod
    def planned(
        cls, metadata: GraphMetadata, ops: tuple[OpBase, ...], edges: tuple[Edge, ...], plan: GenerationPlan
    ) -> OpGraph:
        """A graph of recorded ``ops``/``edges`` followed by the steps ``plan`` builds (not re-validated)."""
        fields: dict[str, Any] = {"metadata": metadata, "ops": ops, "edges": edges, "generation": plan}
        graph = cls.model_construct(schema_version=2, **fields)
        _install_lazy(graph)
        return graph

    @field_serializer("ops", "edges", mode="wrap")
    def _recorded_only(self, value: Any, handler: SerializerFunctionWrapHandler) -> Any:
        # A planned graph saves its recorded ops and edges; the plan saves the rest.
        return handler(value.explicit if isinstance(value, LazyOps | LazyEdges) else value)

    @model_serializer(mode="wrap")
    def _no_empty_plan(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # A graph without a plan is saved exactly as before plans existed (version 1, no ``generation``).
        data: dict[str, object] = handler(self)
        if data.get("generation", 0) is None:
            del data["generation"]
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied. New ``ops`` or ``edges`` replace a generation plan (the copy
        holds exactly the ops given) unless ``generation`` is updated too."""
        replaced = update is not None and ("ops" in update or "edges" in update) and "generation" not in update
        if update and replaced and self.generation is not None:
            full = {name: tuple(getattr(self, name)) for name in ("ops", "edges") if name not in update}
            update = {**full, **update, "generation": None, "schema_version": 1}
        copy = super().model_copy(update=update, deep=deep)
        copy._nx = None
        copy._by_id = None
        if copy.generation is not None and not isinstance(copy.__dict__["ops"], LazyOps):
            _install_lazy(copy)
        return copy

    @property
    def recorded_ops(self) -> tuple[OpBase, ...]:
        """The ops stored op by op (all of them, without a generation plan)."""
        ops = self.__dict__["ops"]
        return ops.explicit if isinstance(ops, LazyOps) else tuple(ops)

    @property
    def recorded_edges(self) -> tuple[Edge, ...]:
        """The edges stored one by one (all of them, without a generation plan)."""
        edges = self.__dict__["edges"]
        return edges.explicit if isinstance(edges, LazyEdges) else tuple(edges)

    def iter_ops(self) -> Iterator[OpBase]:
        """Every op in program order, built step by step for a planned graph (constant memory)."""
        return iter(self.ops)

    def expand(self) -> OpGraph:
        """The same graph with every op and edge built and stored (no generation plan)."""
        if self.generation is None:
            return self
        return OpGraph.model_construct(
            schema_version=1, metadata=self.metadata, ops=tuple(self.ops), edges=tuple(self.edges), generation=None
        )

    def __eq__(self, other: object) -> bool:
        # Compare the saved fields only: the private caches (networkx view, id index) do not count.
        if not isinstance(other, OpGraph):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((self.metadata.model, self.metadata.config_hash, len(self.ops), len(self.edges)))

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[OpBase]:  # type: ignore[override]
        return iter(self.ops)

    def op(self, op_id: int) -> OpBase:
        """The op with id ``op_id``; ``KeyError`` if absent."""
        plan = self.generation
        if plan is not None and op_id >= plan.first_id(plan.first_step):
            off = op_id - plan.first_id(plan.first_step)
            step = plan.first_step + off // plan.op_shift
            if step > plan.last_step or off % plan.op_shift >= plan.step_len(step):
                raise KeyError(op_id)
            return plan.step_ops(step)[off % plan.op_shift]
        if self._by_id is None:
            self._by_id = {o.id: o for o in self.recorded_ops}
        return self._by_id[op_id]

    def ops_of(self, *kinds: OpKind) -> list[OpBase]:
        """The ops of the given kinds, in program order."""
        wanted = set(kinds)
        plan = self.generation
        if plan is None:
            return [o for o in self.ops if o.kind in wanted]
        out = [o for o in self.recorded_ops if o.kind in wanted]
        picked = [j for j, o in enumerate(plan.ops) if o.kind in wanted]
        for step in plan.steps if picked else ():
            # Only the picked ops of each step are built (a step has thousands; a 1,024-step plan millions).
            out.extend(plan.step_op(step, j) for j in picked if j < plan.step_len(step))
        return out

    def predecessors(self) -> dict[int, list[int]]:
        """Op id to the ids it depends on (deduplicated, in edge order)."""
        preds: dict[int, list[int]] = {o.id: [] for o in self.ops}
        for e in self.edges:
            lst = preds.get(e.dst)
            if lst is not None and e.src not in lst:
                lst.append(e.src)
        return preds

    def to_networkx(self) -> nx.DiGraph:
        """A cached ``networkx.DiGraph``: nodes are op ids with ``op`` data, edges carry ``kind``."""
        if self._nx is None:
            import networkx as nx

            g: nx.DiGraph = nx.DiGraph()
            g.add_nodes_from((o.id, {"op": o}) for o in self.ops)
            g.add_edges_from((e.src, e.dst, {"kind": e.kind, "tensor": e.tensor}) for e in self.edges)
            self._nx = g
        return self._nx

    def lint(self) -> None:
        """Check structure: unique ids, edges between existing ops, no self-loops, no cycles.

        A planned graph is checked without building its steps: the recorded part as any graph, the
        plan's template against it (its edges go forward, so every step it builds does too).
        Raises :class:`DuplicateIdError`, :class:`DanglingEdgeError` or :class:`CycleError`.
        """
        ops, edges = self.recorded_ops, self.recorded_edges
        counts = Counter(o.id for o in ops)
        plan = self.generation
        dup = [i for i, c in counts.items() if c > 1]
        if dup:
            raise DuplicateIdError(f"op id {dup[0]} is used by {counts[dup[0]]} ops", where="ops")
        for idx, e in enumerate(edges):
            for end in ("src", "dst"):
                if getattr(e, end) not in counts:
                    raise DanglingEdgeError(
                        f"edge {e.src}->{e.dst} names op {getattr(e, end)} that is not in the graph",
                        where=f"edges.{idx}.{end}",
                    )
            if e.src == e.dst:
                raise CycleError(f"edge {e.src}->{e.dst} is a self-loop", where=f"edges.{idx}")
        if plan is not None:
            # The template is the last recorded step; the steps built from it follow the recorded ops.
            first = plan.first_id(plan.first_step)
            if max(counts, default=-1) != first - 1 or any(o.id not in counts for o in plan.ops):
                raise DanglingEdgeError(
                    f"the generation plan's template (op ids {plan.ops[0].id}..{plan.ops[-1].id}) is not "
                    f"the last recorded step (recorded op ids end at {max(counts, default=-1)})",
                    where="generation",
                )
            for idx, te in enumerate(plan.edges):
                if te.src not in counts:
                    raise DanglingEdgeError(
                        f"template edge {te.src}->{te.dst} names op {te.src} that is not in the graph",
                        where=f"generation.edges.{idx}.src",
                    )
        cycle = find_cycle(ops, edges)
        if cycle:
            path = " -> ".join(str(i) for i in [*cycle, cycle[0]])
            raise CycleError(f"dependency cycle {path}", where="edges", hint="remove one of these edges")

    def summary(self) -> dict[str, object]:
        """Counts and totals by kind, layer and stage (what ``opgraph info`` shows).

        A planned graph is summed from its recorded ops and its plan's per-step costs, without
        building the planned steps' ops.
        """
        by_kind: dict[str, dict[str, int]] = {}
        layers: set[int] = set()
        stages: Counter[str] = Counter()
        totals = [0, 0]

        def add(kind: OpKind, layer: int | None, stage: Stage | None, flops: int, nbytes: int, times: int) -> None:
            row = by_kind.setdefault(kind.value, {"ops": 0, "flops": 0, "bytes": 0})
            row["ops"] += times
            row["flops"] += flops
            row["bytes"] += nbytes
            totals[0] += flops
            totals[1] += nbytes
            if layer is not None:
                layers.add(layer)
            stages[stage.value if isinstance(stage, Stage) else "-"] += times

        for o in self.recorded_ops:
            add(o.kind, o.layer, o.stage, o.flops, o.total_bytes, 1)
        plan = self.generation
        if plan is not None:
            sums = plan.cost_totals()
            for o, (times, flops, nbytes) in zip(plan.ops, sums, strict=True):
                add(o.kind, o.layer, o.stage, flops, nbytes, times)
        return {
            "ops": len(self.ops),
            "edges": len(self.edges),
            "flops": totals[0],
            "bytes": totals[1],
            "layers": len(layers),
            "by_kind": by_kind,
            "stages": dict(stages),
        }


def _install_lazy(graph: OpGraph) -> None:
    """Make a planned graph's ``ops`` and ``edges`` the lazy views over its recorded part and plan."""
    plan = graph.generation
    assert plan is not None
    d = graph.__dict__
    ops = d["ops"]
    edges = d["edges"]
    d["ops"] = LazyOps(ops.explicit if isinstance(ops, LazyOps) else tuple(ops), plan)
    d["edges"] = LazyEdges(edges.explicit if isinstance(edges, LazyEdges) else tuple(edges), plan, _edge)


def _edge(src: int, dst: int, kind: str, tensor: int | None) -> Edge:
    return Edge.model_construct(src=src, dst=dst, kind=EdgeKind(kind), tensor=tensor)
