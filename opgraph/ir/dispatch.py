"""Per-op-class tables: one value (a recipe, a handler, a formula) per op class, found through an op's
class and its bases, refusing a second value for a class.

Extension points keyed by what an op is (replay recipes, tensor-parallel handlers) each keep one
:class:`OpTypeRegistry`. Keys are op model classes: a built-in one (``Gemm``) or a user's subclass
of one (``class FusedGelu(Other)``), which then gets its own entry while its base keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from opgraph.ir.errors import RegistryError
from opgraph.ir.ops import OpBase

T = TypeVar("T")


def _label(value: object) -> str:
    name = getattr(value, "__name__", None)
    return str(name) if isinstance(name, str) else repr(value)


class OpTypeRegistry(Generic[T]):
    """Values by op class; :meth:`lookup` walks the op's class and its bases (nearest first).

    >>> from opgraph.ir import Gemm, Other
    >>> table: OpTypeRegistry[str] = OpTypeRegistry("example")
    >>> table.register(Gemm, "gemm")
    'gemm'
    >>> class Fused(Other): ...
    >>> _ = table.register(Fused, "fused")
    >>> table.lookup(Gemm(id=0, m=1, n=1, k=1)), table.lookup(Fused(id=1, fn="f")), table.lookup(Other(id=2, fn="f"))
    ('gemm', 'fused', None)
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._by_type: dict[type[OpBase], T] = {}

    def check_free(self, op_type: type[OpBase]) -> None:
        """Raise :class:`RegistryError` if ``op_type`` already has an entry."""
        if op_type in self._by_type:
            taken = _label(self._by_type[op_type])
            raise RegistryError(f"{op_type.__name__} ops already have the {self.family} {taken}")

    def register(self, op_type: type[OpBase], value: T) -> T:
        """Make ``value`` the entry of ``op_type``; raises :class:`RegistryError` if it has one."""
        self.check_free(op_type)
        self._by_type[op_type] = value
        return value

    def lookup(self, op: OpBase) -> T | None:
        """The entry of ``op``'s class or its nearest base that has one (``None``: no entry)."""
        for cls in type(op).__mro__:
            if cls in self._by_type:
                return self._by_type[cls]
        return None

    def types_of(self, value: T) -> tuple[type[OpBase], ...]:
        """The op classes whose entry is ``value``."""
        return tuple(t for t, v in self._by_type.items() if v == value)

    def __contains__(self, op_type: object) -> bool:
        return op_type in self._by_type

    def __iter__(self) -> Iterator[type[OpBase]]:
        return iter(self._by_type)
