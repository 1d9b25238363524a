"""Operator coverage: does a captured graph contain the operators its model family must have?

Expectations per family are TOML data files in ``validators/coverage/expectations``; the report
follows the layout of flashinfer-bench's trace verification report.
"""

from validators.coverage.families import (
    Expectation,
    ExpectationError,
    MatchClause,
    OperatorSpec,
    auto_expectation,
    available_families,
    builtin_operators,
    load_expectation,
    load_expectation_file,
)
from validators.coverage.report import CoverageReport, OperatorCoverage, format_report, verify_graph

__all__ = [
    "CoverageReport",
    "Expectation",
    "ExpectationError",
    "MatchClause",
    "OperatorCoverage",
    "OperatorSpec",
    "auto_expectation",
    "available_families",
    "builtin_operators",
    "format_report",
    "load_expectation",
    "load_expectation_file",
    "verify_graph",
]
