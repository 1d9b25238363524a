"""Compare two timelines (simulated, measured, replayed) op by op and end to end."""

from opgraph.compare.compare import (
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
    "Comparison",
    "ErrorRow",
    "GroupError",
    "JoinMode",
    "OpError",
    "compare_timelines",
    "comparison_tables",
    "device_spans",
]
