"""``critical-path``: longest remaining path to the sink first (HLFET list scheduling)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from simulators.policies.base import SchedulingPolicy

if TYPE_CHECKING:
    from simulators.problem import SchedulingProblem


class CriticalPathFirst(SchedulingPolicy):
    """Ready op with the longest path to the end of the graph first."""

    name: ClassVar[str] = "critical-path"

    def priorities(self, problem: SchedulingProblem) -> Sequence[float]:
        """Negated bottom level (own time plus the longest chain after it)."""
        return [-b for b in problem.bottom_levels()]
