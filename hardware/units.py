"""Quantities with units in hardware files: ``"3.35 TB/s"``, ``"80 GiB"``, ``"989.4 TFLOP/s"``.

Hardware files may give any rate or size as a plain number (bytes, bytes/s, FLOP/s) or as a string
with an SI (k, M, G, T, P: powers of 1000) or binary (Ki, Mi, Gi, Ti: powers of 1024) prefix and a
unit. A unit of the wrong kind (``"3 TB"`` for a bandwidth) is an error, not a guess.
"""

from __future__ import annotations

import math
import re
from typing import Literal

QuantityKind = Literal["bytes", "bandwidth", "flops"]
"""What a field measures: a size in bytes, a rate in bytes/s, or a rate in FLOP/s."""

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")
_PREFIX: dict[str, float] = {
    "": 1.0,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
    "p": 1e15,
    "e": 1e18,
    "ki": 2.0**10,
    "mi": 2.0**20,
    "gi": 2.0**30,
    "ti": 2.0**40,
    "pi": 2.0**50,
}
_UNITS: dict[QuantityKind, tuple[str, ...]] = {
    "bytes": ("bytes", "byte", "b"),
    "bandwidth": ("bytes/s", "byte/s", "b/s", "bps"),
    "flops": ("flop/s", "flops", "op/s", "ops", "flop"),
}
_EXAMPLE: dict[QuantityKind, str] = {"bytes": "'80 GiB'", "bandwidth": "'3.35 TB/s'", "flops": "'989.4 TFLOP/s'"}


def parse_quantity(value: object, kind: QuantityKind) -> object:
    """``value`` as a float when it is a number or a string with a unit of ``kind``.

    Anything that is neither (``None``, a dict) is returned unchanged for the field's own
    validation to judge; a malformed string raises ``ValueError`` with an example of the form.
    """
    if isinstance(value, bool) or not isinstance(value, str):
        return value
    match = _NUMBER.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a number with a unit (e.g. {_EXAMPLE[kind]})")
    number = float(match.group(1))
    rest = match.group(2).replace(" ", "").lower()
    for unit in sorted(_UNITS[kind], key=len, reverse=True):
        if rest.endswith(unit):
            prefix = rest[: -len(unit)]
            break
    else:
        prefix = rest
    if prefix not in _PREFIX:
        raise ValueError(f"{value!r}: unknown unit {match.group(2)!r}; expected a {kind} like {_EXAMPLE[kind]}")
    result = number * _PREFIX[prefix]
    if not math.isfinite(result):
        raise ValueError(f"{value!r} is not finite")
    return result
