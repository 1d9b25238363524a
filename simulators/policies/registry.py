"""The registry of scheduling policies: built-ins by name, users' by ``module:Class`` or entry point."""

from __future__ import annotations

from opgraph.ir import Registry, RegistryError
from simulators.policies.base import SchedulingPolicy

POLICIES: Registry[type[SchedulingPolicy]] = Registry("scheduling policy", entry_point_group="opgraph.policies")
"""Policy classes by name; duplicates raise."""

POLICIES.register_lazy("earliest", "simulators.policies.earliest:EarliestAvailable")
POLICIES.register_lazy("critical-path", "simulators.policies.critical_path:CriticalPathFirst")
POLICIES.register_lazy("stream", "simulators.policies.stream:SingleStream")


def get_policy(name: str | SchedulingPolicy | type[SchedulingPolicy]) -> SchedulingPolicy:
    """A policy instance from a registered name, ``package.module:Class``, a class or an instance."""
    if isinstance(name, SchedulingPolicy):
        return name
    obj = POLICIES.get(name) if isinstance(name, str) else name
    if not (isinstance(obj, type) and issubclass(obj, SchedulingPolicy)):
        raise RegistryError(
            f"{name!r} is not a scheduling policy class",
            hint="subclass simulators.policies.SchedulingPolicy and implement priorities()",
        )
    try:
        return obj()
    except TypeError as exc:
        raise RegistryError(f"policy {name!r} cannot be created without arguments: {exc}") from None
