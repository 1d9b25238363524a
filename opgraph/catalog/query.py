"""Queries over a catalog: operations with their config and use counts, and the configs of one op."""

from __future__ import annotations

from fnmatch import fnmatchcase

from opgraph.catalog.build import CatalogError
from opgraph.catalog.models import Catalog, CatalogEntry, ConfigSource
from opgraph.ir.tensor import FrozenModel


class OperationSummary(FrozenModel):
    """One operation of a catalog: how many distinct configs it has and how often they were used."""

    operation: str
    """Operation name (``gemm``, ``rmsnorm``)."""
    kind: str
    """IR kind of its ops."""
    configs: int
    """Distinct configs."""
    uses: int
    """Ops over all sources."""
    definitions: int
    """Distinct definition names."""
    models: tuple[str, ...]
    """Models it appears in, sorted."""


def _matches(value: str, pattern: str) -> bool:
    value, pattern = value.lower(), pattern.lower()
    return fnmatchcase(value, pattern) if any(c in pattern for c in "*?[") else value == pattern


def filter_entries(
    catalog: Catalog,
    *,
    model: str | None = None,
    phase: str | None = None,
    hardware: str | None = None,
) -> list[CatalogEntry]:
    """Entries seen in the given model, phase/stage and hardware, their sources cut to those.

    Names compare case-insensitively; ``*`` and ``?`` make them glob patterns (``llama*``).
    """
    if model is None and phase is None and hardware is None:
        return list(catalog.entries)

    def keep(s: ConfigSource) -> bool:
        if model is not None and not _matches(s.model, model):
            return False
        if phase is not None and not (_matches(s.phase, phase) or _matches(s.stage, phase)):
            return False
        return hardware is None or _matches(s.hardware, hardware)

    out: list[CatalogEntry] = []
    for e in catalog.entries:
        cut = e.restricted(s for s in e.sources if keep(s))
        if cut is not None:
            out.append(cut)
    return out


def summarize(entries: list[CatalogEntry]) -> list[OperationSummary]:
    """Operations of ``entries`` with config and use counts, most used first."""
    groups: dict[str, list[CatalogEntry]] = {}
    for e in entries:
        groups.setdefault(e.operation, []).append(e)
    rows = [
        OperationSummary(
            operation=name,
            kind=es[0].op.kind.value,
            configs=len(es),
            uses=sum(e.uses for e in es),
            definitions=len({e.op.definition for e in es}),
            models=tuple(sorted({m for e in es for m in e.models})),
        )
        for name, es in groups.items()
    ]
    rows.sort(key=lambda r: (-r.uses, r.operation))
    return rows


def select_op(entries: list[CatalogEntry], op: str) -> list[CatalogEntry]:
    """The entries of one operation, named by operation (``gemm``), kind (``norm``), definition
    (``gemm_n4096_k4096``, globs allowed) or config-hash prefix (8+ hex digits); most used first.

    Raises :class:`CatalogError` naming the known operations when nothing matches.
    """
    selectors = (
        lambda e: _matches(e.operation, op),
        lambda e: e.op.kind.value == op.lower(),
        lambda e: _matches(e.op.definition, op),
        lambda e: len(op) >= 8 and e.hash.startswith(op.lower()),
    )
    for sel in selectors:
        hits = [e for e in entries if sel(e)]
        if hits:
            hits.sort(key=lambda e: (-e.uses, e.op.definition, e.hash))
            return hits
    known = sorted({e.operation for e in entries})
    shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
    raise CatalogError(
        f"no operation, kind, definition or config matches {op!r}",
        where="OP",
        hint=f"known operations: {shown}" if known else "the catalog (or the selection) is empty",
    )
