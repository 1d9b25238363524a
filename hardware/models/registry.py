"""Finding a cost model by name: built-ins, ``module:Class``, ``path/to/file.py:Class``, entry points, table files.

Built-ins are registered lazily (importing :mod:`hardware` stays cheap); third-party packages add
models through the ``opgraph.cost_models`` entry-point group; a user's class in a plain Python
file is found by ``my_models.py:MyModel``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from hardware.base import CostModel, CostModelError
from hardware.profile import PROFILE_SUFFIX
from opgraph.ir import OpgraphError, Registry, RegistryError

ENTRY_POINT_GROUP = "opgraph.cost_models"
"""Entry-point group third-party packages register cost models in."""

COST_MODELS: Registry[object] = Registry("cost model", entry_point_group=ENTRY_POINT_GROUP)
"""Names of cost models to their class (or factory). Duplicates raise."""
COST_MODELS.register_lazy("roofline", "hardware.models.roofline:RooflineModel")
COST_MODELS.register_lazy("formula", "hardware.models.formula:FormulaModel")
COST_MODELS.register_lazy("table", "hardware.models.table:TableModel")
COST_MODELS.register_lazy("collective", "hardware.models.collective:AlphaBetaCollectiveModel")
COST_MODELS.register_lazy("profile", "hardware.models.profile:ProfileModel")

_TABLE_SUFFIXES = (".json", ".json.gz")


def parse_cost_options(items: list[str] | tuple[str, ...]) -> dict[str, object]:
    """``["key=value", ...]`` (CLI ``--cost-option``) as a dict; values stay strings for the model to coerce.

    A value that is JSON (``0.5``, ``true``, ``{"gemm": 1.1}``) is decoded first.
    """
    import json

    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CostModelError(f"cost model option {item!r} is not KEY=VALUE", where="--cost-option")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _load_file_module(path: Path) -> object:
    """Import a Python file as a module (once per resolved path)."""
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"opgraph_user_{resolved.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise CostModelError("cannot import this file as Python", where=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CostModelError(f"importing it raised {type(exc).__name__}: {exc}", where=str(path)) from exc
    return module


def load_from_file(spec: str) -> object:
    """The object ``spec`` (``path/to/file.py:Name``, dots for nested names) names, its file imported once
    per resolved path; a missing file or name is a :class:`CostModelError`."""
    file_part, _, attr = spec.rpartition(":")
    path = Path(file_part)
    if not path.is_file():
        raise CostModelError("no such Python file", where=str(path), hint="give path/to/file.py:ClassName")
    obj = _load_file_module(path)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CostModelError(f"has no attribute {attr!r}", where=str(path))
        obj = getattr(obj, part)
    return obj


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names an object in a Python file (``path/to/file.py:Name``)."""
    file_part, sep, attr = spec.rpartition(":")
    return bool(sep and attr and file_part.endswith(".py"))


def resolve_cost_model(spec: str, **options: object) -> CostModel:
    """A ready cost model from ``spec``, built with ``options``.

    ``spec`` is one of: a built-in name (``roofline``, ``formula``, ``table``, ``collective``,
    ``profile``); a path to a device profile (``h100.profile.json``, what ``opgraph profile``
    writes); a path to a saved cost table (``calib.json``, what ``opgraph calibrate`` writes); ``module:Class``;
    ``path/to/file.py:Class``; or a name in the ``opgraph.cost_models`` entry-point group. A class
    (or factory) is called with ``options``; an instance is used as it is.

    Raises :class:`~hardware.base.CostModelError` (or ``RegistryError`` for an unknown name, listing
    the built-ins) with the spec or file named.

    Examples
    --------
    >>> type(resolve_cost_model("roofline", attention_efficiency=0.7)).__name__
    'RooflineModel'
    """
    spec = spec.strip()
    if spec.endswith(PROFILE_SUFFIX) and ":" not in spec.replace("\\", "/").split("/")[-1]:
        return instantiate_cost_model(COST_MODELS.get("profile"), spec, {"path": spec, **options})
    if spec.endswith(_TABLE_SUFFIXES) and ":" not in spec.replace("\\", "/").split("/")[-1]:
        return instantiate_cost_model(COST_MODELS.get("table"), spec, {"table": spec, **options})
    if is_file_spec(spec):
        obj = load_from_file(spec)
    else:
        try:
            obj = COST_MODELS.get(spec)
        except RegistryError as exc:
            raise RegistryError(exc.message, where="--cost-model", hint=exc.hint) from None
    return instantiate_cost_model(obj, spec, options)


def instantiate_cost_model(obj: object, spec: str, options: dict[str, object]) -> CostModel:
    """``obj`` (a class, factory or instance) as a :class:`CostModel`, checked."""
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "estimate")):
        try:
            model = obj(**options)
        except CostModelError as exc:
            raise CostModelError(exc.message, where=exc.where or spec, hint=exc.hint) from None
        except TypeError as exc:
            raise CostModelError(
                f"cannot build {spec} with options {sorted(options)}: {exc}", where="--cost-model"
            ) from None
        except OpgraphError:
            raise
        except Exception as exc:
            raise CostModelError(f"building {spec} raised {type(exc).__name__}: {exc}", where="--cost-model") from exc
    else:
        if options:
            raise CostModelError(
                f"{spec} is an instance already; it takes no options ({', '.join(sorted(options))})",
                where="--cost-model",
            )
        model = obj
    if not isinstance(model, CostModel):
        raise CostModelError(
            f"{spec} gives a {type(model).__name__}, which has no estimate(op, hw) method",
            where="--cost-model",
            hint="a cost model is any object with estimate(op, hw) -> Cost",
        )
    return model


def cost_model_names() -> list[str]:
    """Built-in and registered cost model names (entry points not included)."""
    return COST_MODELS.names()
