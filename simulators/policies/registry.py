"""The registry of scheduling policies: built-ins by name, users' by ``module:Class``, ``path/to/file.py:Class``
or entry point.

A ``file.py:Class`` is imported by the loader the cost models use (:mod:`hardware.models.registry`), so a
policy and a cost model in one user file load it once, with the same errors.
"""

from __future__ import annotations

from opgraph.ir import OpgraphError, Registry, RegistryError
from simulators.policies.base import SchedulingPolicy

POLICIES: Registry[type[SchedulingPolicy]] = Registry("scheduling policy", entry_point_group="opgraph.policies")
"""Policy classes by name; duplicates raise."""

POLICIES.register_lazy("earliest", "simulators.policies.earliest:EarliestAvailable")
POLICIES.register_lazy("critical-path", "simulators.policies.critical_path:CriticalPathFirst")
POLICIES.register_lazy("stream", "simulators.policies.stream:SingleStream")


def get_policy(name: str | SchedulingPolicy | type[SchedulingPolicy]) -> SchedulingPolicy:
    """A policy instance from a registered name, ``package.module:Class``, ``path/to/file.py:Class``, a
    class or an instance."""
    if isinstance(name, SchedulingPolicy):
        return name
    obj = _lookup(name) if isinstance(name, str) else name
    if not (isinstance(obj, type) and issubclass(obj, SchedulingPolicy)):
        raise RegistryError(
            f"{name!r} is not a scheduling policy class",
            hint="subclass simulators.policies.SchedulingPolicy and implement priorities()",
        )
    try:
        return obj()
    except TypeError as exc:
        raise RegistryError(f"policy {name!r} cannot be created without arguments: {exc}") from None


def _lookup(spec: str) -> object:
    """The object ``spec`` names: a ``file.py:Class`` from its file, anything else from :data:`POLICIES`."""
    from hardware.models.registry import is_file_spec, load_from_file

    if not is_file_spec(spec.strip()):
        return POLICIES.get(spec)
    try:
        return load_from_file(spec.strip())
    except OpgraphError as exc:  # the loader's errors are CostModelErrors: say they are about a policy
        raise RegistryError(f"policy {spec!r}: {exc.message}", where=exc.where, hint=exc.hint) from None
