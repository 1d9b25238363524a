"""Per-op-kind cost formulas: the one registry every built-in cost model dispatches through.

In the spirit of torch's ``register_flop_formula``: a formula is a function
``formula(model, op, hw) -> Cost`` registered for a cost model (by its ``name``) and a key, which
is an :class:`~opgraph.ir.OpKind`, a kind string, or an op class. Registering a key twice for one
model raises. A model finds the formula for an op by, in order:

1. the model instance's own ``formulas`` mapping (per-instance overrides, like torch's
   ``custom_mapping``), then the registry;
2. within each, the op's class and its bases (a user's ``class FusedRouter(Other)`` beats the
   ``other`` kind), then the op's kind, then :class:`~opgraph.ir.OpBase` (the model's default);
3. the model class's ``name``, then the names of the classes it derives from (a subclass of
   :class:`~hardware.models.roofline.RooflineModel` keeps every roofline formula).

>>> from hardware import COST_FORMULAS, Bound, Cost, register_cost
>>> from opgraph.ir import Other
>>> class Fused(Other):
...     rows: int = 0
>>> @register_cost("roofline", Fused)
... def fused_cost(model, op, hw):
...     return Cost(op.rows * 1e-9, Bound.COMPUTE, detail="my fused kernel")
>>> from hardware import load_hardware, resolve_cost_model
>>> round(resolve_cost_model("roofline").estimate(Fused(id=0, rows=1000), load_hardware("h100")).us, 6)
1.0
>>> COST_FORMULAS.unregister("roofline", Fused)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from hardware.base import Bound, Cost, CostModel, UncostedOpError, eager_attention_cost
from hardware.models.collective import AlphaBetaCollectiveModel
from hardware.models.options import apply_options
from hardware.spec import HardwareSpec
from opgraph.ir import OpBase, RegistryError

CostFormula = Callable[[Any, Any, HardwareSpec], Cost]
"""``formula(model, op, hw) -> Cost``: the model instance (for its parameters and helpers), the op."""
CostKey = Enum | str | type[OpBase]
"""What a formula is registered for: an op kind (enum or string) or an op class."""
F = TypeVar("F", bound=CostFormula)
P = TypeVar("P", bound=BaseModel)


def _key(key: object) -> str | type[OpBase]:
    if isinstance(key, Enum):
        return str(key.value)
    if isinstance(key, str) and key.strip():
        return key.strip()
    if isinstance(key, type) and issubclass(key, OpBase):
        return key
    raise RegistryError(f"a cost formula is registered for an op kind or an op class, not {key!r}")


def _label(key: str | type[OpBase]) -> str:
    return key if isinstance(key, str) else key.__name__


def kind_name(op: OpBase) -> str:
    """The op's kind as a string (``"gemm"``), whether the kind is an enum member or a plain string."""
    kind = getattr(op, "kind", "other")
    return str(kind.value) if isinstance(kind, Enum) else str(kind)


def model_names(model: object) -> tuple[str, ...]:
    """The ``name`` of ``model``'s class and of each class it derives from, most derived first."""
    names: list[str] = []
    for cls in type(model).__mro__:
        name = cls.__dict__.get("name")
        if isinstance(name, str) and name not in names:
            names.append(name)
    return tuple(names)


def _lookup_order(op: OpBase) -> Iterator[str | type[OpBase]]:
    for cls in type(op).__mro__:
        if cls is OpBase:
            break
        if isinstance(cls, type) and issubclass(cls, OpBase):
            yield cls
    yield kind_name(op)
    yield OpBase


class CostRegistry:
    """Cost formulas by (model name, op kind or class). Duplicates raise :class:`~opgraph.ir.RegistryError`."""

    def __init__(self) -> None:
        self._formulas: dict[tuple[str, str | type[OpBase]], CostFormula] = {}

    def register(self, model: str, key: CostKey, formula: F) -> F:
        """Register ``formula`` for ops of ``key`` under the cost model named ``model``."""
        k = _key(key)
        if (model, k) in self._formulas:
            raise RegistryError(
                f"the {model} cost model already has a formula for {_label(k)!r}",
                hint="unregister it first, or pass your formula to this one model with formulas={...}",
            )
        self._formulas[(model, k)] = formula
        return formula

    def unregister(self, model: str, key: CostKey) -> None:
        """Remove a registered formula (raises when there is none)."""
        k = _key(key)
        if self._formulas.pop((model, k), None) is None:
            raise RegistryError(f"the {model} cost model has no formula for {_label(k)!r}")

    def keys(self, model: str) -> list[str]:
        """The kinds and op classes ``model`` has formulas for, as names, sorted."""
        return sorted(_label(k) for m, k in self._formulas if m == model)

    def find(self, model: object, op: OpBase) -> CostFormula | None:
        """The formula ``model`` uses for ``op`` (see the module docstring for the order), or ``None``."""
        custom: Mapping[str | type[OpBase], CostFormula] = getattr(model, "formulas", None) or {}
        order = tuple(_lookup_order(op))
        for key in order:
            if key in custom:
                return custom[key]
        for name in model_names(model):
            for key in order:
                formula = self._formulas.get((name, key))
                if formula is not None:
                    return formula
        return None


def formula_overrides(formulas: Mapping[CostKey, CostFormula] | None) -> dict[str | type[OpBase], CostFormula]:
    """A model's per-instance ``formulas`` argument with its keys checked and normalised."""
    return {_key(k): f for k, f in (formulas or {}).items()}


COST_FORMULAS = CostRegistry()
"""The registry of every built-in and user cost formula."""


def register_cost(model: str | type, *keys: CostKey) -> Callable[[F], F]:
    """Decorator: register ``formula(model, op, hw) -> Cost`` for each of ``keys`` under ``model``.

    ``model`` is a cost model's name (``"roofline"``, ``"formula"``) or its class; ``keys`` are op
    kinds (``OpKind.GEMM`` or ``"gemm"``) or op classes (your own ``OpBase`` subclass).
    """
    name = model if isinstance(model, str) else getattr(model, "name", None)
    if not isinstance(name, str):
        raise RegistryError(f"{model!r} is not a cost model name nor a class with a name attribute")
    if not keys:
        raise RegistryError("register_cost needs at least one op kind or op class")

    def wrap(formula: F) -> F:
        for key in keys:
            COST_FORMULAS.register(name, key, formula)
        return formula

    return wrap


class FormulaDispatchModel(Generic[P]):
    """Base of cost models that cost each op by the formula registered for its kind or class.

    Subclasses set ``name`` and ``params_type`` and register their formulas under ``name``.

    Parameters
    ----------
    params:
        The model's parameters; keyword ``options`` override single fields.
    collective:
        The model for :class:`~opgraph.ir.Collective` ops (alpha-beta by default).
    formulas:
        Per-instance cost formulas by op kind or class, used before the registered ones.
    """

    name: str
    """The model's name: formulas are registered under it."""
    params_type: type[P]

    def __init__(
        self,
        params: P | None = None,
        *,
        collective: CostModel | None = None,
        formulas: Mapping[CostKey, CostFormula] | None = None,
        **options: object,
    ) -> None:
        self.params: P = apply_options(self.params_type, params, options, self.name)
        self.collective: CostModel = collective or AlphaBetaCollectiveModel()
        self.formulas = formula_overrides(formulas)
        self.setup()

    def setup(self) -> None:
        """Hook: what a subclass prepares once its parameters are set (nothing by default)."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The cost of ``op`` on ``hw``, by the formula registered for its class or kind (eager attention:
        the sum of its kernels', :func:`~hardware.base.eager_attention_cost`)."""
        eager = eager_attention_cost(self, op, hw)
        if eager is not None:
            return eager
        formula = COST_FORMULAS.find(self, op)
        if formula is None:
            raise UncostedOpError(f"the {self.name} model has no rule for ops of kind {kind_name(op)!r}")
        return formula(self, op, hw)


def view_cost(model: object, op: OpBase, hw: HardwareSpec) -> Cost:
    """Views launch no kernel: free (every built-in model registers it for ``view``)."""
    return Cost(0.0, Bound.FREE, detail="view: no kernel")


def collective_cost(model: FormulaDispatchModel[Any], op: OpBase, hw: HardwareSpec) -> Cost:
    """Collectives go to the model's ``collective`` model (every built-in model registers it)."""
    return model.collective.estimate(op, hw)
