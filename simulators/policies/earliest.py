"""``earliest``: the seed's naive scheduler, list scheduling in program order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from simulators.policies.base import SchedulingPolicy

if TYPE_CHECKING:
    from simulators.problem import SchedulingProblem


class EarliestAvailable(SchedulingPolicy):
    """Earliest available engine takes the first ready op in program order."""

    name: ClassVar[str] = "earliest"

    def priorities(self, problem: SchedulingProblem) -> Sequence[float]:
        """Program order."""
        return range(len(problem))
