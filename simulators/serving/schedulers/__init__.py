"""Serving schedulers, one module each: static batching, continuous batching, chunked prefill."""

from simulators.serving.schedulers.base import Scheduler
from simulators.serving.schedulers.chunked import ChunkedPrefill
from simulators.serving.schedulers.continuous import ContinuousBatching
from simulators.serving.schedulers.registry import SCHEDULERS, SchedulerError, get_scheduler, register_scheduler
from simulators.serving.schedulers.static import StaticBatching

__all__ = [
    "SCHEDULERS",
    "ChunkedPrefill",
    "ContinuousBatching",
    "Scheduler",
    "SchedulerError",
    "StaticBatching",
    "get_scheduler",
    "register_scheduler",
]
