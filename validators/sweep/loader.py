"""Turn catalog configs into sweep cases and pytest parametrisations (the seed's ``MasterConfigLoader``).

Two modes, as in the seed:

- default: the deduplicated exact configs that models used, most used first;
- ``all_cases=True``: for each group of configs of an op that share a call structure, the product
  of their distinct *shapes* (sizes, tensor shapes and strides, integer arguments), *dtypes* (compute,
  tensor and dtype arguments) and *options* (flags and float/string arguments). Combinations that
  the IR rejects are dropped; the product is capped by ``max_cases``.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from pydantic import ValidationError

from opgraph.catalog import Catalog, CatalogEntry, CatalogError, filter_entries, load_catalog, select_op
from opgraph.ir import IDENTITY_FIELDS, OpBase, OpgraphError, parse_op
from opgraph.ir.configs import config_dict, config_hash, dtype_signature, size_label

if TYPE_CHECKING:
    from _pytest.mark import ParameterSet

DEFAULT_MAX_CASES = 5000
"""Largest ``all_cases`` product built without an explicit ``limit``."""


class SweepError(OpgraphError):
    """A sweep cannot be built as asked (too many cases, nothing selected)."""


@dataclass(frozen=True)
class SweepCase:
    """One test case of a sweep: an op to replay and a readable id."""

    id: str
    """pytest id (``gemm_n4096_k4096-m2048-bf16``)."""
    op: OpBase
    """The op to replay (identity stripped)."""
    hash: str
    """Config hash."""
    uses: int
    """Times the config was seen in the catalog (0 for combinations only ``all_cases`` made)."""
    models: tuple[str, ...] = ()
    """Models that used it, sorted (empty for synthesised combinations)."""

    @property
    def traced(self) -> bool:
        """True when a model used exactly this config."""
        return self.uses > 0

    def to_json(self) -> dict[str, Any]:
        """JSON form, as embedded in generated modules."""
        return {
            "id": self.id,
            "hash": self.hash,
            "uses": self.uses,
            "models": list(self.models),
            "op": self.op.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepCase:
        """Inverse of :meth:`to_json`; the hash is checked against the op."""
        op = parse_op(data["op"])
        h = config_hash(op)
        if data.get("hash") not in (None, h):
            raise SweepError(f"case {data.get('id')!r}: hash does not match its op", hint="regenerate the module")
        return cls(
            id=str(data["id"]), op=op, hash=h, uses=int(data.get("uses", 0)), models=tuple(data.get("models", ()))
        )


# --- ids -----------------------------------------------------------------------------------------

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=-]+")


def case_id(op: OpBase, extra: str = "") -> str:
    """``<definition>-<sizes>-<dtypes>[-<extra>]``, e.g. ``gemm_n4096_k4096-m2048-bf16``."""
    parts = [op.definition, size_label(op), dtype_signature(op), extra]
    return _ID_UNSAFE.sub("_", "-".join(p for p in parts if p))


def _unique_ids(cases: list[SweepCase]) -> list[SweepCase]:
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.id] = counts.get(c.id, 0) + 1
    out = []
    for c in cases:
        if counts[c.id] > 1:
            c = SweepCase(id=f"{c.id}-h{c.hash[:8]}", op=c.op, hash=c.hash, uses=c.uses, models=c.models)
        out.append(c)
    return out


# --- all_cases decomposition ---------------------------------------------------------------------

_COMMON = IDENTITY_FIELDS | {"flops", "bytes_read", "bytes_written", "definition"}
_GROUP_FIELDS = {"kind", "target", "fn", "collective"}
_DTYPE_FIELDS = {"dtype", "out_dtype"}

Path_ = tuple[str | int, ...]
Leaf = tuple[Path_, str, Any]  # (path, axis, value) with axis in fixed|shape|dtype|option


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _is_scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (list, dict)) for v in value)


def _call_leaves(value: Any, path: Path_, out: list[Leaf]) -> None:
    if isinstance(value, dict):
        if set(value) == {"tensor"}:
            out.append((path, "fixed", _freeze(value)))
        elif set(value) == {"dtype"}:
            out.append((path, "dtype", _freeze(value)))
        else:
            for k in sorted(value):
                _call_leaves(value[k], (*path, k), out)
    elif isinstance(value, list) and not _is_scalar_list(value):
        for i, v in enumerate(value):
            _call_leaves(v, (*path, i), out)
    elif isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        out.append((path, "option", _freeze(value)))
    else:  # ints and lists of scalars (sizes, dims) go with the shapes
        out.append((path, "shape", _freeze(value)))


def _leaves(data: dict[str, Any]) -> list[Leaf]:
    out: list[Leaf] = []
    for key, value in data.items():
        if key in _COMMON:
            continue
        if key in _GROUP_FIELDS:
            out.append(((key,), "fixed", value))
        elif key in _DTYPE_FIELDS:
            out.append(((key,), "dtype", value))
        elif key in ("inputs", "outputs"):
            for i, t in enumerate(value):
                out.append(((key, i, "shape"), "shape", _freeze(t["shape"])))
                out.append(((key, i, "strides"), "shape", _freeze(t.get("strides"))))
                out.append(((key, i, "dtype"), "dtype", t["dtype"]))
        elif key == "call":
            if value is None:
                out.append((("call",), "fixed", None))
            else:
                _call_leaves(value.get("args", []), ("call", "args"), out)
                _call_leaves(value.get("keywords", {}), ("call", "keywords"), out)
        elif isinstance(value, bool):
            out.append(((key,), "option", value))
        else:
            out.append(((key,), "shape", _freeze(value)))
    return out


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
            return {k: _thaw(v) for k, v in value}
        return [_thaw(v) for v in value]
    return value


def _set_path(data: Any, path: Path_, value: Any) -> None:
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = _thaw(value)


@dataclass
class _Group:
    template: dict[str, Any]
    shapes: dict[Any, tuple[tuple[Path_, Any], ...]]
    dtypes: dict[Any, tuple[tuple[Path_, Any], ...]]
    options: dict[Any, tuple[tuple[Path_, Any], ...]]
    definition_of_shape: dict[Any, str | None]


def _group_key(leaves: list[Leaf]) -> Any:
    fixed = tuple((p, v) for p, a, v in leaves if a == "fixed")
    paths = tuple((p, a) for p, a, _ in leaves if a != "fixed")
    return (fixed, paths)


def _all_case_ops(entries: Sequence[CatalogEntry]) -> list[OpBase]:
    groups: dict[Any, _Group] = {}
    for e in entries:
        data = config_dict(e.op)
        leaves = _leaves(data)
        key = _group_key(leaves)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(template=data, shapes={}, dtypes={}, options={}, definition_of_shape={})
        axes: dict[str, list[tuple[Path_, Any]]] = {"shape": [], "dtype": [], "option": []}
        for p, a, v in leaves:
            if a != "fixed":
                axes[a].append((p, v))
        shape = tuple(axes["shape"])
        g.shapes.setdefault(shape, shape)
        g.dtypes.setdefault(tuple(axes["dtype"]), tuple(axes["dtype"]))
        g.options.setdefault(tuple(axes["option"]), tuple(axes["option"]))
        # A definition set by capture (not the IR's default name) is kept for its shapes.
        is_custom = e.op.definition != e.op.default_definition()
        g.definition_of_shape.setdefault(shape, e.op.definition if is_custom else None)
    ops: list[OpBase] = []
    for g in groups.values():
        for shape, dtypes, options in itertools.product(g.shapes, g.dtypes, g.options):
            data = json.loads(json.dumps(g.template))
            for p, v in (*shape, *dtypes, *options):
                _set_path(data, p, v)
            for k in ("flops", "bytes_read", "bytes_written", "definition"):
                data.pop(k, None)
            custom = g.definition_of_shape[shape]
            if custom is not None:
                data["definition"] = custom
            try:
                ops.append(parse_op(data))
            except (ValidationError, ValueError):
                continue  # an impossible combination (e.g. heads not divisible by kv_heads)
    return ops


def _option_label(op: OpBase, varying: set[Path_]) -> str:
    parts = []
    for p, a, v in _leaves(config_dict(op)):
        if a != "option" or p not in varying:
            continue
        name = str(p[-1]) if isinstance(p[-1], str) else f"arg{p[-1]}"
        if isinstance(v, bool):
            parts.append(name if v else f"no{name}")
        else:
            parts.append(f"{name}{v}")
    return "-".join(parts)


# --- the loader ----------------------------------------------------------------------------------


class SweepLoader:
    """Sweep cases from a catalog (a :class:`~opgraph.catalog.Catalog` or the path of one).

    >>> from opgraph.catalog import build_catalog
    >>> from opgraph.ir import Gemm, GraphMetadata, OpGraph
    >>> ops = (Gemm(id=0, m=2048, n=4096, k=4096), Gemm(id=1, m=1, n=4096, k=4096))
    >>> loader = SweepLoader(build_catalog([OpGraph(metadata=GraphMetadata(model="m"), ops=ops)]))
    >>> [c.id for c in loader.cases("gemm")]
    ['gemm_n4096_k4096-m1-bf16', 'gemm_n4096_k4096-m2048-bf16']
    """

    def __init__(self, catalog: Catalog | str | Path) -> None:
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)

    def operations(self) -> list[str]:
        """Operation names in the catalog."""
        return list(self.catalog.operations)

    def cases(
        self,
        op: str,
        *,
        all_cases: bool = False,
        model: str | None = None,
        phase: str | None = None,
        limit: int | None = None,
        max_cases: int = DEFAULT_MAX_CASES,
    ) -> list[SweepCase]:
        """The cases of ``op`` (operation, kind, definition glob or hash prefix).

        Default: each distinct traced config once, most used first; equally used ones by definition,
        then by sizes in numeric order (``m1`` before ``m2048``), dtypes and hash (see
        :func:`_traced_order`). A ``phase`` (or stage) no config was seen in is a
        :class:`SweepError` naming the catalog's phases. ``all_cases``: the product of
        distinct shapes, dtypes and options (traced configs first among equals); raises
        :class:`SweepError` past ``max_cases`` unless ``limit`` truncates.
        """
        if phase is not None and not filter_entries(self.catalog, phase=phase):
            known = sorted({n for e in self.catalog.entries for s in e.sources for n in (s.phase, s.stage) if n})
            raise SweepError(
                f"unknown phase {phase!r}: no config of the catalog was seen in it",
                where="--phase",
                hint=f"valid phases: {', '.join(known)}" if known else "the catalog records no phases",
            )
        entries = filter_entries(self.catalog, model=model, phase=phase)
        try:
            hits = select_op(entries, op)
        except CatalogError as exc:
            raise SweepError(exc.message, where=exc.where, hint=exc.hint) from None
        by_hash = {e.hash: e for e in hits}
        if not all_cases:
            hits = sorted(hits, key=_traced_order)
            cases = [SweepCase(id=case_id(e.op), op=e.op, hash=e.hash, uses=e.uses, models=e.models) for e in hits]
        else:
            ops = _all_case_ops(hits)
            if limit is None and len(ops) > max_cases:
                raise SweepError(
                    f"all_cases of {op!r} makes {len(ops)} cases, more than max_cases={max_cases}",
                    hint="narrow it with a model or phase, set a limit, or raise max_cases",
                )
            varying = _varying_options(ops)
            cases = []
            seen: set[str] = set()
            for o in ops:
                h = config_hash(o)
                if h in seen:
                    continue
                seen.add(h)
                e = by_hash.get(h)
                label = _option_label(o, varying)
                if e is not None:
                    cases.append(SweepCase(id=case_id(o, label), op=e.op, hash=h, uses=e.uses, models=e.models))
                else:
                    cases.append(SweepCase(id=case_id(o, label), op=o, hash=h, uses=0))
        if limit is not None:
            cases = cases[:limit]
        return _unique_ids(cases)

    def get_suite_parameters(self, op: str, *, all_cases: bool = False, **kwargs: Any) -> list[ParameterSet]:
        """``pytest.param(op, id=...)`` for each case (the seed's name for :func:`sweep_params`)."""
        return to_params(self.cases(op, all_cases=all_cases, **kwargs))


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of ``text`` with its digit runs compared as numbers (``m2`` before ``m10``)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(text) if p)


_DIGITS = re.compile(r"(\d+)")


def _traced_order(e: CatalogEntry) -> tuple[Any, ...]:
    """Order of traced configs: most used first, then definition, sizes (numerically), dtypes, hash.

    The catalog breaks ties by config hash alone, which is stable but says nothing; sizes in numeric
    order keep a sweep's equally used configs readable (``m1`` before ``m2048``).
    """
    return (-e.uses, e.op.definition, _natural(size_label(e.op)), dtype_signature(e.op), e.hash)


def _varying_options(ops: Iterable[OpBase]) -> set[Path_]:
    values: dict[Path_, set[Any]] = {}
    for o in ops:
        for p, a, v in _leaves(config_dict(o)):
            if a == "option":
                values.setdefault(p, set()).add(v)
    return {p for p, vs in values.items() if len(vs) > 1}


def to_params(cases: Iterable[SweepCase]) -> list[ParameterSet]:
    """``pytest.param(case.op, id=case.id)`` for each case (pytest imported here, lazily)."""
    import pytest

    return [pytest.param(c.op, id=c.id) for c in cases]


class CaseOptions(TypedDict, total=False):
    """The keyword options of :meth:`SweepLoader.cases` (defaults there), as :func:`sweep_params` takes them."""

    all_cases: bool
    model: str | None
    phase: str | None
    limit: int | None
    max_cases: int


def sweep_params(catalog: Catalog | str | Path, op: str, **options: Unpack[CaseOptions]) -> list[ParameterSet]:
    """pytest parametrisation of the configs of ``op`` in ``catalog``: ``pytest.param(op, id=...)``.

    ``options`` are those of :meth:`SweepLoader.cases`. Use as
    ``@pytest.mark.parametrize("op", sweep_params("catalog.json", "gemm"))``.
    """
    return to_params(SweepLoader(catalog).cases(op, **options))


def params_from_json(text: str) -> list[ParameterSet]:
    """pytest parametrisation from cases embedded as JSON (``opgraph sweep --embed``)."""
    return to_params(SweepCase.from_json(d) for d in json.loads(text))


__all__ = [
    "DEFAULT_MAX_CASES",
    "CaseOptions",
    "SweepCase",
    "SweepError",
    "SweepLoader",
    "case_id",
    "params_from_json",
    "sweep_params",
    "to_params",
]
