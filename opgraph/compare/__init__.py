"""Compare two timelines (simulated, measured, replayed) op by op and end to end."""

from opgraph.compare.compare import (
    CPU_PROFILE_NOTE,
    compare_timelines,
    comparison_tables,
    cpu_device_view,
    device_spans,
)
from opgraph.compare.measured import compare_measured
from opgraph.compare.result import (
    CompareError,
    Comparison,
    ErrorRow,
    GroupError,
    JoinMode,
    OpError,
    StepError,
)

__all__ = [
    "CPU_PROFILE_NOTE",
    "CompareError",
    "Comparison",
    "ErrorRow",
    "GroupError",
    "JoinMode",
    "OpError",
    "StepError",
    "compare_measured",
    "compare_timelines",
    "comparison_tables",
    "cpu_device_view",
    "device_spans",
]
