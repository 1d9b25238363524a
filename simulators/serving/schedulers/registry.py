"""The scheduler registry: names to classes; registering a taken name raises."""

from __future__ import annotations

from opgraph.ir import OpgraphError
from simulators.serving.schedulers.base import Scheduler
from simulators.serving.schedulers.chunked import ChunkedPrefill
from simulators.serving.schedulers.continuous import ContinuousBatching
from simulators.serving.schedulers.static import StaticBatching

__all__ = ["SCHEDULERS", "SchedulerError", "get_scheduler", "register_scheduler"]


class SchedulerError(OpgraphError):
    """An unknown or duplicate scheduler name."""


SCHEDULERS: dict[str, type[Scheduler]] = {}
"""Registered schedulers by name."""


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    """Add ``cls`` under ``cls.name``; a name already taken raises :class:`SchedulerError`."""
    if not cls.name:
        raise SchedulerError(f"{cls.__name__} has no name", where="scheduler registry")
    if cls.name in SCHEDULERS:
        raise SchedulerError(f"scheduler {cls.name!r} is already registered", where="scheduler registry")
    SCHEDULERS[cls.name] = cls
    return cls


for _cls in (StaticBatching, ContinuousBatching, ChunkedPrefill):
    register_scheduler(_cls)


def get_scheduler(name: str) -> Scheduler:
    """A new scheduler of ``name``."""
    cls = SCHEDULERS.get(name.strip().lower())
    if cls is None:
        raise SchedulerError(f"unknown scheduler {name!r}", where="--scheduler", hint=f"one of {', '.join(SCHEDULERS)}")
    return cls()
