"""``stream``: one in-order stream per engine group, as an eager GPU runs kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from simulators.policies.base import SchedulingPolicy

if TYPE_CHECKING:
    from simulators.problem import SchedulingProblem


class SingleStream(SchedulingPolicy):
    """One in-order stream: ops of a group run one at a time in program order."""

    name: ClassVar[str] = "stream"
    in_order: ClassVar[bool] = True
    max_engines: ClassVar[int | None] = 1

    def priorities(self, problem: SchedulingProblem) -> Sequence[float]:
        """Program order."""
        return range(len(problem))
