"""The scheduling-policy contract: one hook that ranks ops, plus two facts about the queue."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from simulators.problem import SchedulingProblem


class SchedulingPolicy(ABC):
    """Decides which ready op a free engine takes next.

    The one hook, :meth:`priorities`, gives every op a priority before the run; whenever an
    engine of a group is free it takes the ready op of that group with the lowest priority
    (ties by program order), so a policy costs O(log n) per op however many ops are ready.
    When several engines are free, the one free longest gets the op (the earliest available).

    Subclasses set ``name`` and may set ``in_order`` (an op may start only after every op of its
    group ranked before it has started: a stream) and ``max_engines`` (engines per group it models).
    Register a subclass in :data:`simulators.policies.POLICIES` or pass ``package.module:Class``.
    """

    name: ClassVar[str] = ""
    """Registry name."""
    in_order: ClassVar[bool] = False
    """Ops of a group start strictly in priority order (head-of-line blocking)."""
    max_engines: ClassVar[int | None] = None
    """Cap on engines per group (1 for a single stream); ``None`` for no cap."""

    @abstractmethod
    def priorities(self, problem: SchedulingProblem) -> Sequence[float]:
        """Priority of each op by program index; lower runs first among ready ops."""

    def describe(self) -> str:
        """One line for summaries (the class docstring's first line)."""
        doc = (type(self).__doc__ or self.name).strip().splitlines()
        return doc[0] if doc else self.name
