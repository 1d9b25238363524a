"""A small name -> factory registry that raises on duplicates and resolves ``module:attr`` lazily.

Families of interchangeable parts (cost models, scheduling policies, lowering passes, replay
recipes) each keep one :class:`Registry`. Built-ins are registered as import strings so that
importing a package stays cheap; user parts are found by ``package.module:Name`` or through an
entry-point group.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from opgraph.ir.errors import RegistryError

T = TypeVar("T")


def import_object(spec: str) -> object:
    """Import ``package.module:attr`` (or ``package.module.attr``) and return the attribute."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise RegistryError(f"{spec!r} is not of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RegistryError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


class Registry(Generic[T]):
    """Names to objects of one family; duplicates raise, unknown names list the known ones.

    Parameters
    ----------
    family:
        What the entries are, for messages ("cost model", "policy").
    entry_point_group:
        An optional ``importlib.metadata`` entry-point group searched for names not registered.
    """

    def __init__(self, family: str, entry_point_group: str | None = None) -> None:
        self.family = family
        self.entry_point_group = entry_point_group
        self._lazy: dict[str, str] = {}
        self._loaded: dict[str, T] = {}

    def register(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name``; raises :class:`RegistryError` if taken."""
        if name in self._loaded or name in self._lazy:
            raise RegistryError(f"{self.family} {name!r} is already registered")
        self._loaded[name] = obj
        return obj

    def register_lazy(self, name: str, spec: str) -> None:
        """Register ``package.module:attr`` under ``name``, imported on first use."""
        if name in self._loaded or name in self._lazy:
            raise RegistryError(f"{self.family} {name!r} is already registered")
        self._lazy[name] = spec

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object."""

        def wrap(obj: T) -> T:
            return self.register(name, obj)

        return wrap

    def names(self) -> list[str]:
        """Every registered name (built-in and lazy), sorted."""
        return sorted({*self._loaded, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        """The object for ``name``: registered, lazy, ``module:attr``, or an entry point."""
        if name in self._loaded:
            return self._loaded[name]
        if name in self._lazy:
            obj: T = import_object(self._lazy[name])  # type: ignore[assignment]
            self._loaded[name] = obj
            del self._lazy[name]
            return obj
        if ":" in name:
            return import_object(name)  # type: ignore[return-value]
        if self.entry_point_group:
            for ep in entry_points(group=self.entry_point_group):
                if ep.name == name:
                    loaded: T = ep.load()
                    return loaded
        known = ", ".join(self.names()) or "none"
        raise RegistryError(
            f"unknown {self.family} {name!r}",
            hint=f"known: {known}; or give 'package.module:Name'",
        )
