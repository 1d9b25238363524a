"""Built-in cost models (roofline, formula, table, profile, alpha-beta collectives) and their registry."""

from hardware.models.collective import AlphaBetaCollectiveModel, CollectiveParams, ring_factors
from hardware.models.dispatch import (
    COST_FORMULAS,
    CostFormula,
    CostKey,
    CostRegistry,
    FormulaDispatchModel,
    register_cost,
)
from hardware.models.efficiency import EfficiencyCurve, GemmTile, RooflineParams
from hardware.models.formula import FormulaModel, FormulaParams, HardwareIgnoredWarning
from hardware.models.profile import (
    Features,
    ProfileExtrapolationWarning,
    ProfileModel,
    ProfileWritebackWarning,
    default_cost_model,
    profile_features,
    roofline_seconds,
)
from hardware.models.registry import (
    COST_MODELS,
    ENTRY_POINT_GROUP,
    cost_model_names,
    parse_cost_options,
    resolve_cost_model,
)
from hardware.models.roofline import RooflineModel
from hardware.models.table import (
    CostTable,
    TableEntry,
    TableExtrapolationWarning,
    TableModel,
    load_cost_table,
    shape_key,
    table_work,
)

__all__ = [
    "COST_FORMULAS",
    "COST_MODELS",
    "ENTRY_POINT_GROUP",
    "AlphaBetaCollectiveModel",
    "CollectiveParams",
    "CostFormula",
    "CostKey",
    "CostRegistry",
    "CostTable",
    "EfficiencyCurve",
    "Features",
    "FormulaDispatchModel",
    "FormulaModel",
    "FormulaParams",
    "GemmTile",
    "HardwareIgnoredWarning",
    "ProfileExtrapolationWarning",
    "ProfileModel",
    "ProfileWritebackWarning",
    "RooflineModel",
    "RooflineParams",
    "TableEntry",
    "TableExtrapolationWarning",
    "TableModel",
    "cost_model_names",
    "default_cost_model",
    "load_cost_table",
    "parse_cost_options",
    "profile_features",
    "register_cost",
    "resolve_cost_model",
    "ring_factors",
    "roofline_seconds",
    "shape_key",
    "table_work",
]
