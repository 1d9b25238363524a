"""What a serving scheduler is: one method that plans the next step from the server's state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from simulators.serving.requests import Request
from simulators.serving.state import Plan, ServingState

__all__ = ["Scheduler"]


class Scheduler(ABC):
    """Plans steps. Admission goes through :meth:`ServingState.admit` (FCFS: the queue's head first)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @abstractmethod
    def plan(self, state: ServingState) -> Plan:
        """The next step (empty when nothing can run until a request arrives)."""

    def unservable(self, request: Request, state: ServingState) -> str | None:
        """Why this scheduler can never run ``request`` (a stated drop), or ``None``."""
        return None
