"""Building catalogs: merge graphs (and other catalogs) into deduplicated configs with provenance.

:class:`CatalogBuilder` accumulates counts in memory keyed by config hash and source, so merging
is linear in the number of ops; only the first op of each new config is re-validated.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from opgraph.catalog.models import Catalog, CatalogEntry, ConfigSource, GraphRecord
from opgraph.ir import OpBase, OpGraph, OpKind, load_graph, load_model, parse_op, save_model
from opgraph.ir.configs import config_dict, hash_config_dict, operation_name
from opgraph.ir.errors import OpgraphError

_SourceKey = tuple[str, str, str, str, str, str]


class CatalogError(OpgraphError):
    """A catalog cannot be built, read or queried as asked."""


@dataclass(frozen=True)
class AddResult:
    """What adding one graph did."""

    model: str
    """Model of the graph."""
    ops: int
    """Ops counted (views excluded unless asked for)."""
    configs: int
    """Distinct configs in the graph."""
    new_configs: int
    """Configs the catalog did not have before."""
    skipped: bool = False
    """True when the same graph was already in the catalog and nothing was added."""


def graph_fingerprint(graph: OpGraph) -> str:
    """sha256 of a graph's serialised form: equal for equal graphs, whatever file they came from."""
    return hashlib.sha256(graph.model_dump_json().encode()).hexdigest()


def _hardware_of(graph: OpGraph) -> str:
    cap = graph.metadata.capture
    for key in ("hardware", "gpu", "device_name"):
        value = cap.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class CatalogBuilder:
    """Accumulates graphs into a catalog.

    Parameters
    ----------
    base:
        A catalog to extend (its entries and graph records are kept).
    include_views:
        Also catalog ``view`` ops (free metadata ops that launch no kernel); off by default.
    """

    def __init__(self, base: Catalog | None = None, *, include_views: bool = False) -> None:
        self.include_views = include_views
        self._ops: dict[str, OpBase] = {}
        self._operation: dict[str, str] = {}
        self._counts: dict[str, Counter[_SourceKey]] = {}
        self._graphs: list[GraphRecord] = []
        self._fingerprints: set[str] = set()
        if base is not None:
            self.add_catalog(base)

    def __len__(self) -> int:
        return len(self._ops)

    def add_catalog(self, other: Catalog) -> int:
        """Merge another catalog (counts add up; graphs already present are not counted twice).

        Returns the number of configs that were new.
        """
        new = 0
        skip_graphs = [g for g in other.graphs if g.fingerprint in self._fingerprints]
        if skip_graphs and len(skip_graphs) == len(other.graphs) and other.graphs:
            return 0
        if skip_graphs:
            raise CatalogError(
                f"the catalogs share {len(skip_graphs)} of their graphs (first: {skip_graphs[0].model} "
                f"{skip_graphs[0].phase}), so their counts cannot be added",
                hint="rebuild one of them from the graphs the other lacks",
            )
        for entry in other.entries:
            if entry.hash not in self._ops:
                self._ops[entry.hash] = entry.op
                self._operation[entry.hash] = entry.operation
                self._counts[entry.hash] = Counter()
                new += 1
            counts = self._counts[entry.hash]
            for s in entry.sources:
                counts[s.key()] += s.count
        for g in other.graphs:
            self._graphs.append(g)
            self._fingerprints.add(g.fingerprint)
        return new

    def add_graph(
        self, graph: OpGraph, *, path: str | Path = "", hardware: str | None = None, force: bool = False
    ) -> AddResult:
        """Merge one graph's ops.

        ``hardware`` names the hardware when the graph's metadata does not (``capture.hardware``).
        A graph already merged (same fingerprint) is skipped unless ``force``.
        """
        md = graph.metadata
        model = md.model or (Path(path).name if path else "unknown")
        fingerprint = graph_fingerprint(graph)
        if fingerprint in self._fingerprints and not force:
            return AddResult(model=model, ops=0, configs=0, new_configs=0, skipped=True)
        device = str(md.capture.get("device") or "")
        hw = hardware or _hardware_of(graph)
        phase = md.phase
        per_config: Counter[str] = Counter()
        new = 0
        for op in graph.ops:
            if op.kind is OpKind.VIEW and not self.include_views:
                continue
            data = config_dict(op)
            h = hash_config_dict(data)
            if h not in self._ops:
                self._ops[h] = parse_op(data)
                self._operation[h] = operation_name(op)
                self._counts[h] = Counter()
                new += 1
            stage = op.stage.value if op.stage is not None else ""
            self._counts[h][(model, md.architecture, phase, stage, device, hw)] += 1
            per_config[h] += 1
        record = GraphRecord(
            fingerprint=fingerprint,
            model=model,
            architecture=md.architecture,
            phase=phase,
            device=device,
            hardware=hw,
            path=str(path),
            ops=sum(per_config.values()),
            configs=len(per_config),
        )
        self._graphs.append(record)
        self._fingerprints.add(fingerprint)
        return AddResult(model=model, ops=record.ops, configs=record.configs, new_configs=new)

    def build(self) -> Catalog:
        """The catalog so far, entries sorted by operation, definition and hash."""
        entries: list[CatalogEntry] = []
        for h, op in self._ops.items():
            sources = tuple(
                ConfigSource(model=k[0], architecture=k[1], phase=k[2], stage=k[3], device=k[4], hardware=k[5], count=c)
                for k, c in sorted(self._counts[h].items())
            )
            entries.append(
                CatalogEntry.model_construct(hash=h, operation=self._operation[h], op=op, sources=sources)  # type: ignore[arg-type]
            )
        entries.sort(key=lambda e: (e.operation, e.op.definition, e.hash))
        return Catalog(graphs=tuple(self._graphs), entries=tuple(entries))


def build_catalog(graphs: Iterable[OpGraph], *, include_views: bool = False) -> Catalog:
    """A catalog of the configs of ``graphs``.

    >>> from opgraph.ir import Gemm, GraphMetadata, OpGraph
    >>> g = OpGraph(metadata=GraphMetadata(model="tiny"), ops=(Gemm(id=0, m=4, n=8, k=8), Gemm(id=1, m=4, n=8, k=8)))
    >>> cat = build_catalog([g])
    >>> len(cat), cat.entries[0].uses
    (1, 2)
    """
    builder = CatalogBuilder(include_views=include_views)
    for g in graphs:
        builder.add_graph(g)
    return builder.build()


def merge_catalogs(*catalogs: Catalog) -> Catalog:
    """One catalog from several: configs deduplicated, provenance counts added."""
    builder = CatalogBuilder()
    for c in catalogs:
        builder.add_catalog(c)
    return builder.build()


def load_catalog(path: str | Path) -> Catalog:
    """Load a catalog saved by :func:`save_catalog` (``.json`` or ``.json.gz``)."""
    return load_model(path, Catalog)


def save_catalog(catalog: Catalog, path: str | Path) -> Path:
    """Save a catalog as JSON (gzip when the name ends in ``.gz``), atomically."""
    return save_model(catalog, path)


def add_graph_files(
    catalog_path: str | Path,
    graph_paths: Iterable[str | Path],
    *,
    hardware: str | None = None,
    include_views: bool = False,
    force: bool = False,
) -> tuple[Catalog, list[AddResult]]:
    """Create or extend the catalog file at ``catalog_path`` with graph files; saves atomically.

    Every graph is loaded before anything is written, so a bad graph leaves the catalog untouched.
    """
    catalog_path = Path(catalog_path)
    base = load_catalog(catalog_path) if catalog_path.exists() else None
    builder = CatalogBuilder(base, include_views=include_views)
    results = []
    for p in graph_paths:
        graph = load_graph(p)
        results.append(builder.add_graph(graph, path=str(p), hardware=hardware, force=force))
    catalog = builder.build()
    save_catalog(catalog, catalog_path)
    return catalog, results
