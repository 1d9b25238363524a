"""Hardware specs, the device catalog and cost models.

>>> from hardware import load_hardware, resolve_cost_model
>>> from opgraph.ir import Gemm
>>> hw = load_hardware("h100")
>>> cost = resolve_cost_model("roofline").estimate(Gemm(id=0, m=8192, n=8192, k=8192), hw)
>>> cost.bound.value
'compute'
"""

from hardware.base import (
    Bound,
    Cost,
    CostModel,
    CostModelError,
    CostModelWarning,
    GraphCosts,
    UncostedOpError,
    check_cost,
    cost_graph,
    cost_key,
    cost_warnings,
    estimate_op,
)
from hardware.calibrate import CalibrationError, Measurement, fit_cost_table, host_overhead_from_trace
from hardware.loader import (
    UnknownHardwareError,
    catalog_spec,
    list_hardware,
    load_hardware,
    load_hardware_file,
    normalize_name,
)
from hardware.models import (
    COST_FORMULAS,
    COST_MODELS,
    ENTRY_POINT_GROUP,
    AlphaBetaCollectiveModel,
    CollectiveParams,
    CostFormula,
    CostKey,
    CostRegistry,
    CostTable,
    EfficiencyCurve,
    FormulaModel,
    FormulaParams,
    GemmTile,
    HardwareIgnoredWarning,
    RooflineModel,
    RooflineParams,
    TableEntry,
    TableModel,
    cost_model_names,
    load_cost_table,
    parse_cost_options,
    register_cost,
    resolve_cost_model,
)
from hardware.spec import DeviceKind, HardwareSpec, HostOverhead, Interconnect, PeakFlops
from hardware.units import parse_quantity

__all__ = [
    "COST_FORMULAS",
    "COST_MODELS",
    "ENTRY_POINT_GROUP",
    "AlphaBetaCollectiveModel",
    "Bound",
    "CalibrationError",
    "CollectiveParams",
    "Cost",
    "CostFormula",
    "CostKey",
    "CostModel",
    "CostModelError",
    "CostModelWarning",
    "CostRegistry",
    "CostTable",
    "DeviceKind",
    "EfficiencyCurve",
    "FormulaModel",
    "FormulaParams",
    "GemmTile",
    "GraphCosts",
    "HardwareIgnoredWarning",
    "HardwareSpec",
    "HostOverhead",
    "Interconnect",
    "Measurement",
    "PeakFlops",
    "RooflineModel",
    "RooflineParams",
    "TableEntry",
    "TableModel",
    "UncostedOpError",
    "UnknownHardwareError",
    "catalog_spec",
    "check_cost",
    "cost_graph",
    "cost_key",
    "cost_model_names",
    "cost_warnings",
    "estimate_op",
    "fit_cost_table",
    "host_overhead_from_trace",
    "list_hardware",
    "load_cost_table",
    "load_hardware",
    "load_hardware_file",
    "normalize_name",
    "parse_cost_options",
    "parse_quantity",
    "register_cost",
    "resolve_cost_model",
]
