"""Building a cost model's parameters from keyword options (``--cost-option key=value``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from hardware.base import CostModelError

P = TypeVar("P", bound=BaseModel)


def apply_options(cls: type[P], base: P | None, options: Mapping[str, object], model: str) -> P:
    """``base`` (or ``cls()``) with ``options`` (field names of ``cls``) applied; bad ones raise
    :class:`~hardware.base.CostModelError` naming the option and the ``model``."""
    params = base if base is not None else cls()
    if not options:
        return params
    unknown = sorted(set(options) - set(cls.model_fields))
    if unknown:
        raise CostModelError(
            f"unknown option {unknown[0]!r} for the {model} model",
            hint=f"known: {', '.join(sorted(cls.model_fields))}",
        )
    try:
        return cls.model_validate({**params.model_dump(), **options})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CostModelError(f"bad option {loc} for the {model} model: {err['msg']}") from None


def flag(value: bool | str) -> bool:
    """A yes/no option given as a bool or as text (``--cost-option check_hardware=false``: ``0``, ``false``,
    ``no`` and ``off`` are no)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return value
