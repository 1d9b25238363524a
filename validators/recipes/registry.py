"""The registry of replay recipes and the rule that picks one for an op.

:func:`register_recipe` is the one way in: it registers a recipe class by name (for
``--recipe TARGET=name`` overrides and entry points) and as the recipe of one op class, refusing
duplicates of either. Dispatch walks the op's class and its bases, so a recipe registered for a
user's subclass of an op (``class FusedGelu(Other)``) serves that subclass only.

Order of choice: a user override for the op's target or definition (``--recipe TARGET=pkg.mod:Class``),
then the recorded aten call (single-aten ops replay exactly as recorded), then the recipe registered
for the op's class (composites: attention, norms, RoPE, MoE routing, grouped GEMMs...). Collectives
and ops no recipe covers come back with a reason instead of a recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opgraph.ir import OP_TYPES, OpBase, OpKind, Registry, RegistryError
from opgraph.ir.dispatch import OpTypeRegistry
from validators.recipes.base import Recipe

RECIPES: Registry[type[Recipe[Any]]] = Registry("replay recipe", entry_point_group="opgraph.replay_recipes")
"""Recipe classes by name (filled by :func:`register_recipe`); ``--recipe`` overrides name them."""

_FOR_OP: OpTypeRegistry[str] = OpTypeRegistry("replay recipe")
"""The recipe name registered for each op class."""

R = TypeVar("R", bound=type[Recipe[Any]])


def register_recipe(for_op: type[OpBase] | OpKind | None = None) -> Callable[[R], R]:
    """Class decorator: register a recipe under its ``name`` and as the recipe of ops of ``for_op``.

    ``for_op`` is an op class (a built-in one or a user's subclass of one) or an :class:`OpKind`
    (its model class); ``None`` registers the name only (recipes chosen by override). Raises
    :class:`~opgraph.ir.RegistryError` when the name or the op class already has a recipe.

    >>> from opgraph.ir import Other
    >>> class Halve(Other):
    ...     factor: float = 0.5
    >>> @register_recipe(Halve)
    ... class HalveRecipe(Recipe[Halve]):
    ...     name = "doc-halve"
    ...     def build(self, op, ctx): ...
    >>> recipe_name_for(Halve(id=0, fn="halve"))
    'doc-halve'
    """
    op_type = OP_TYPES[OpKind(for_op)] if isinstance(for_op, OpKind | str) else for_op

    def wrap(cls: R) -> R:
        if not cls.name:
            raise RegistryError(f"replay recipe {cls.__qualname__} has no name (set the class attribute 'name')")
        if op_type is not None:
            _FOR_OP.check_free(op_type)
        RECIPES.register(cls.name, cls)
        if op_type is not None:
            _FOR_OP.register(op_type, cls.name)
        return cls

    return wrap


def recipe_name_for(op: OpBase) -> str | None:
    """The name of the recipe registered for ``op``'s class or its nearest base (``None``: none)."""
    return _FOR_OP.lookup(op)


@dataclass
class Selection:
    """The recipe chosen for an op, or why there is none."""

    recipe: Recipe[Any] | None
    reason: str = ""
    skipped: bool = False
    """True when the op is deliberately not run (collectives), rather than unsupported."""


@dataclass
class RecipeSelector:
    """Picks recipes; ``overrides`` maps a target or definition to a recipe name or ``pkg.mod:Class``."""

    overrides: dict[str, str] = field(default_factory=dict)
    _instances: dict[str, Recipe[Any]] = field(default_factory=dict)

    def instance(self, name: str) -> Recipe[Any]:
        """A (cached) instance of the recipe ``name``."""
        inst = self._instances.get(name)
        if inst is None:
            cls = RECIPES.get(name)
            if not (isinstance(cls, type) and issubclass(cls, Recipe)):
                raise RegistryError(f"{name!r} is not a replay recipe class (a subclass of validators.recipes.Recipe)")
            inst = self._instances[name] = cls()
        return inst

    def _checked(self, name: str, op: OpBase) -> Selection:
        """The recipe ``name`` for ``op``, unless ``op`` is not of its op class or it refuses ``op``."""
        recipe = self.instance(name)
        types = _FOR_OP.types_of(name)
        if types and not isinstance(op, types):
            wanted = " or ".join(t.__name__ for t in types)
            return Selection(None, f"{op.target or 'op'}: the {name} recipe needs a {wanted} op")
        reason = recipe.unsupported(op)
        return Selection(None, reason) if reason else Selection(recipe)

    def select(self, op: OpBase) -> Selection:
        """The recipe for ``op`` or the reason it has none."""
        target = op.target or ""
        override = self.overrides.get(target) or self.overrides.get(op.definition)
        if override:
            return self._checked(override, op)
        name = recipe_name_for(op)
        if op.call is not None and target:
            aten = self._checked("aten", op)
            if aten.recipe is not None or name is None:
                return aten
        if name is not None:
            return self._checked(name, op)
        kind = op.kind.value
        if kind == "collective":
            return Selection(
                None,
                f"{target or op.definition}: collectives are not replayed (they need a process group of the "
                "graph's ranks; time them with a communication benchmark)",
                skipped=True,
            )
        if kind == "view":
            return Selection(None, f"{target or op.definition}: a view launches no kernel", skipped=True)
        return Selection(None, f"no replay recipe for {target or op.definition} (kind {kind}, no recorded aten call)")
