"""Replay recipes: one module per family of ops, a registry, and the rule that picks one for an op.

To add a recipe, subclass :class:`Recipe` for your op class and decorate it with
:func:`register_recipe` (``@register_recipe(MyOp)``); the built-ins below do the same.
"""

# The built-in recipes register themselves on import (no torch at import time).
from validators.recipes import aten, attention, gemm, memory, moe, norm, pointwise, rope  # noqa: F401
from validators.recipes.base import BuildContext, Case, Compare, Recipe
from validators.recipes.registry import RECIPES, RecipeSelector, Selection, recipe_name_for, register_recipe

__all__ = [
    "RECIPES",
    "BuildContext",
    "Case",
    "Compare",
    "Recipe",
    "RecipeSelector",
    "Selection",
    "recipe_name_for",
    "register_recipe",
]
