"""Compare two timelines (simulated, measured, replayed) op by op and end to end."""

from opgraph.compare.compare import (
    CompareError,
    Comparison,
    ErrorRow,
    GroupError,
    JoinMode,
    OpError,
    compare_timelines,
    comparison_tables,
    device_spans,
)

__all__ = [
    "CompareError",
    "Comparison",
    "ErrorRow",
    "GroupError",
    "JoinMode",
    "OpError",
    "compare_timelines",
    "comparison_tables",
    "device_spans",
]
