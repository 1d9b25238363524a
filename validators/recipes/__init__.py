"""Replay recipes: one module per family of ops, a registry, and the rule that picks one for an op."""

from validators.recipes.base import BuildContext, Case, Compare, Recipe
from validators.recipes.registry import KIND_RECIPES, RECIPES, RecipeSelector, Selection

__all__ = [
    "KIND_RECIPES",
    "RECIPES",
    "BuildContext",
    "Case",
    "Compare",
    "Recipe",
    "RecipeSelector",
    "Selection",
]
