"""``OpGraph``: typed ops, typed dependency edges, capture metadata, and its structural lint."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, PrivateAttr

from opgraph.ir.algorithms import find_cycle as find_cycle
from opgraph.ir.errors import CycleError, DanglingEdgeError, DuplicateIdError
from opgraph.ir.ops import Op, OpBase, OpKind, Stage
from opgraph.ir.tensor import FROZEN, NonNegInt

if TYPE_CHECKING:
    import networkx as nx

SCHEMA_VERSION = 1
"""Version of the saved graph and timeline format; bumped on incompatible changes."""

Scalar = str | int | float | bool | None
"""A JSON scalar, for settings and attributes."""


class EdgeKind(str, Enum):
    """Why one op must wait for another."""

    DATA = "data"
    """A tensor written by ``src`` is read by ``dst``."""
    ORDER = "order"
    """Program order or a stream/side-effect dependency with no tensor."""


class Edge(BaseModel):
    """A dependency: ``dst`` may start only after ``src`` ends."""

    model_config = FROZEN

    src: NonNegInt
    """Id of the producing op."""
    dst: NonNegInt
    """Id of the consuming op."""
    kind: EdgeKind = EdgeKind.DATA
    """Data or order dependency."""
    tensor: int | None = None
    """Id of the tensor that flows, for data edges."""


class GraphMetadata(BaseModel):
    """Where a graph came from and under which assumptions."""

    model_config = FROZEN

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
    capture: dict[str, Scalar] = Field(default_factory=dict)
    """Capture settings (batch, seq_len, kv_len, dtype, device, attention implementation)."""
    versions: dict[str, str] = Field(default_factory=dict)
    """Library versions at capture (torch, transformers, opgraph)."""
    assumptions: tuple[str, ...] = ()
    """Data-dependent values that were assumed rather than computed (MoE routing, ``.item()``)."""


class OpGraph(BaseModel):
    """A model's ops and their dependencies. The serialised form is this pydantic model."""

    model_config = FROZEN

    schema_version: Literal[1] = 1
    """Format version; loaders refuse other versions with a clear message."""
    metadata: GraphMetadata = Field(default_factory=GraphMetadata)
    """Provenance and settings."""
    ops: tuple[Op, ...] = ()
    """Ops in program order."""
    edges: tuple[Edge, ...] = ()
    """Dependencies between ops."""

    _nx: nx.DiGraph | None = PrivateAttr(default=None)
    _by_id: dict[int, OpBase] | None = PrivateAttr(default=None)

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
        if self._by_id is None:
            self._by_id = {o.id: o for o in self.ops}
        return self._by_id[op_id]

    def ops_of(self, *kinds: OpKind) -> list[OpBase]:
        """The ops of the given kinds, in program order."""
        wanted = set(kinds)
        return [o for o in self.ops if o.kind in wanted]

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

        Raises :class:`DuplicateIdError`, :class:`DanglingEdgeError` or :class:`CycleError`.
        """
        counts = Counter(o.id for o in self.ops)
        dup = [i for i, c in counts.items() if c > 1]
        if dup:
            raise DuplicateIdError(f"op id {dup[0]} is used by {counts[dup[0]]} ops", where="ops")
        for idx, e in enumerate(self.edges):
            for end in ("src", "dst"):
                if getattr(e, end) not in counts:
                    raise DanglingEdgeError(
                        f"edge {e.src}->{e.dst} names op {getattr(e, end)} that is not in the graph",
                        where=f"edges.{idx}.{end}",
                    )
            if e.src == e.dst:
                raise CycleError(f"edge {e.src}->{e.dst} is a self-loop", where=f"edges.{idx}")
        cycle = find_cycle(self.ops, self.edges)
        if cycle:
            path = " -> ".join(str(i) for i in [*cycle, cycle[0]])
            raise CycleError(f"dependency cycle {path}", where="edges", hint="remove one of these edges")

    def summary(self) -> dict[str, object]:
        """Counts and totals by kind, layer and stage (what ``opgraph info`` shows)."""
        by_kind: dict[str, dict[str, int]] = {}
        layers: set[int] = set()
        stages: Counter[str] = Counter()
        for o in self.ops:
            row = by_kind.setdefault(o.kind.value, {"ops": 0, "flops": 0, "bytes": 0})
            row["ops"] += 1
            row["flops"] += o.flops
            row["bytes"] += o.total_bytes
            if o.layer is not None:
                layers.add(o.layer)
            stages[o.stage.value if isinstance(o.stage, Stage) else "-"] += 1
        return {
            "ops": len(self.ops),
            "edges": len(self.edges),
            "flops": sum(o.flops for o in self.ops),
            "bytes": sum(o.total_bytes for o in self.ops),
            "layers": len(layers),
            "by_kind": by_kind,
            "stages": dict(stages),
        }
