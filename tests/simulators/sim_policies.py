"""A user-defined scheduling policy, found by ``sim_policies:LongestFirst`` in the tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from simulators import SchedulingPolicy, SchedulingProblem


class LongestFirst(SchedulingPolicy):
    """Longest ready op first."""

    name: ClassVar[str] = "longest-first"

    def priorities(self, problem: SchedulingProblem) -> Sequence[float]:
        return [-d for d in problem.dur_us]
