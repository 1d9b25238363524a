"""The registry of replay recipes and the rule that picks one for an op.

Order of choice: a user override for the op's target or definition (``--recipe TARGET=pkg.mod:Class``),
then the recorded aten call (single-aten ops replay exactly as recorded), then the recipe of the
op's kind (composites: attention, norms, RoPE, MoE routing, grouped GEMMs...). Collectives and ops
no recipe covers come back with a reason instead of a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opgraph.ir import OpBase, Registry, RegistryError
from validators.recipes.base import Recipe, op_kind

RECIPES: Registry[type[Recipe]] = Registry("replay recipe", entry_point_group="opgraph.replay_recipes")
"""Recipe classes by name; users add theirs with ``RECIPES.register(name, cls)`` or an entry point."""

for _name, _spec in {
    "aten": "validators.recipes.aten:AtenRecipe",
    "attention": "validators.recipes.attention:AttentionRecipe",
    "norm": "validators.recipes.norm:NormRecipe",
    "rope": "validators.recipes.rope:RopeRecipe",
    "gemm": "validators.recipes.gemm:GemmRecipe",
    "moe_routing": "validators.recipes.moe:MoeRoutingRecipe",
    "activation": "validators.recipes.pointwise:ActivationRecipe",
    "elementwise": "validators.recipes.pointwise:ElementwiseRecipe",
    "softmax": "validators.recipes.pointwise:SoftmaxRecipe",
    "reduction": "validators.recipes.pointwise:ReductionRecipe",
    "topk": "validators.recipes.pointwise:TopKRecipe",
    "embedding": "validators.recipes.pointwise:EmbeddingRecipe",
    "memory": "validators.recipes.memory:MemoryRecipe",
}.items():
    RECIPES.register_lazy(_name, _spec)

KIND_RECIPES: dict[str, str] = {
    "attention": "attention",
    "norm": "norm",
    "rope": "rope",
    "gemm": "gemm",
    "moe_routing": "moe_routing",
    "activation": "activation",
    "elementwise": "elementwise",
    "softmax": "softmax",
    "reduction": "reduction",
    "topk": "topk",
    "embedding": "embedding",
    "memory": "memory",
}
"""The recipe of each op kind, for ops with no recorded call."""


@dataclass
class Selection:
    """The recipe chosen for an op, or why there is none."""

    recipe: Recipe | None
    reason: str = ""
    skipped: bool = False
    """True when the op is deliberately not run (collectives), rather than unsupported."""


@dataclass
class RecipeSelector:
    """Picks recipes; ``overrides`` maps a target or definition to a recipe name or ``pkg.mod:Class``."""

    overrides: dict[str, str] = field(default_factory=dict)
    _instances: dict[str, Recipe] = field(default_factory=dict)

    def instance(self, name: str) -> Recipe:
        """A (cached) instance of the recipe ``name``."""
        inst = self._instances.get(name)
        if inst is None:
            cls = RECIPES.get(name)
            if not (isinstance(cls, type) and issubclass(cls, Recipe)):
                raise RegistryError(f"{name!r} is not a replay recipe class (a subclass of validators.recipes.Recipe)")
            inst = self._instances[name] = cls()
        return inst

    def select(self, op: OpBase) -> Selection:
        """The recipe for ``op`` or the reason it has none."""
        target = op.target or ""
        override = self.overrides.get(target) or self.overrides.get(op.definition)
        if override:
            recipe = self.instance(override)
            reason = recipe.unsupported(op)
            return Selection(None, reason) if reason else Selection(recipe)
        kind = op_kind(op)
        if op.call is not None and target:
            aten = self.instance("aten")
            reason = aten.unsupported(op)
            if reason is None:
                return Selection(aten)
            if kind not in KIND_RECIPES:
                return Selection(None, reason)
        if kind == "collective":
            return Selection(
                None,
                f"{target or op.definition}: collectives are not replayed (they need a process group of the "
                "graph's ranks; time them with a communication benchmark)",
                skipped=True,
            )
        if kind == "view":
            return Selection(None, f"{target or op.definition}: a view launches no kernel", skipped=True)
        name = KIND_RECIPES.get(kind)
        if name is None:
            return Selection(
                None, f"no replay recipe for {target or op.definition} (kind {kind}, no recorded aten call)"
            )
        recipe = self.instance(name)
        reason = recipe.unsupported(op)
        return Selection(None, reason) if reason else Selection(recipe)
