"""Scheduling policies: which ready op a free engine takes next."""

from simulators.policies.base import SchedulingPolicy
from simulators.policies.registry import POLICIES, get_policy

__all__ = ["POLICIES", "SchedulingPolicy", "get_policy"]
