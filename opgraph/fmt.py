"""Number formatting for people: durations, counts, bytes, shares (pure functions, one home).

>>> fmt_us(1234.5)
'1.234 ms'
>>> fmt_us(0.5)
'0.50 us'
>>> fmt_us(float("inf"))
'inf'
>>> fmt_us_sig(1234.5)
'1.234 ms'
>>> fmt_us_sig(2_500_000)
'2.5 s'
>>> fmt_count(1.5e12, "FLOP")
'1.5 TFLOP'
>>> fmt_count(12)
'12'
>>> fmt_bytes(3 * 1024**3)
'3 GiB'
>>> fmt_pct(0.1234)
'12.3%'
>>> fmt_x(2.0)
'2x'
"""

from __future__ import annotations

import math
from decimal import Decimal

__all__ = ["fmt_bytes", "fmt_count", "fmt_pct", "fmt_us", "fmt_us_sig", "fmt_x"]


def fmt_us(value_us: float) -> str:
    """A duration given in microseconds, in the unit that reads best, fixed decimals (``1.234 ms``).

    The unit is picked after rounding: ``999.996`` us reads ``1.000 ms``, never ``1000.00 us``.
    """
    v = float(value_us)
    if not math.isfinite(v):
        return str(v)
    if abs(round(v, 2)) < 1e3:
        return f"{v:.2f} us"
    if abs(round(v / 1e3, 3)) < 1e3:
        return f"{v / 1e3:.3f} ms"
    return f"{v / 1e6:.3f} s"


def fmt_us_sig(value_us: float, digits: int = 4) -> str:
    """A duration in microseconds with ``digits`` significant digits, in the unit that reads best."""
    v = float(value_us)
    if not math.isfinite(v):
        return f"{v} us"
    number, unit = _scaled(v, ("us", "ms", "s"), 1000, digits)
    return f"{number} {unit}"


def fmt_count(value: float, unit: str = "") -> str:
    """``1.23 G``-style engineering format (k, M, G, T, P, E), three significant digits.

    The prefix is picked after rounding (``999.6`` reads ``1 k``), and no number has an exponent.
    """
    v = float(value)
    if not math.isfinite(v):
        return f"{v} {unit}".rstrip()
    number, prefix = _scaled(v, ("", "k", "M", "G", "T", "P", "E"), 1000, 3)
    return f"{number} {prefix}{unit}".rstrip()


def fmt_bytes(value: float) -> str:
    """Bytes in binary units (B, KiB, MiB, GiB, TiB, PiB, EiB), three significant digits.

    Values from 1000 to 1023 of a unit keep their four integer digits (``1010 KiB``); one that
    rounds to 1024 reads as 1 of the next unit. No number has an exponent.
    """
    v = float(value)
    if not math.isfinite(v):
        return f"{v} B"
    number, unit = _scaled(v, ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"), 1024, 3)
    return f"{number} {unit}"


def fmt_pct(fraction: float) -> str:
    """A fraction as a percentage with one decimal (``0.1234`` -> ``12.3%``)."""
    return f"{fraction * 100:.1f}%"


def fmt_x(ratio: float) -> str:
    """A ratio as a factor with three significant digits (``2.0`` -> ``2x``), never an exponent."""
    r = float(ratio)
    return f"{_plain(r, 3) if math.isfinite(r) else r}x"


def _plain(v: float, digits: int) -> str:
    """``v`` rounded to ``digits`` significant digits, written without an exponent (``1e+03`` -> ``1000``)."""
    text = f"{v:.{digits}g}"
    return format(Decimal(text), "f") if "e" in text else text


def _scaled(v: float, units: tuple[str, ...], step: int, digits: int) -> tuple[str, str]:
    """``v`` (finite, in ``units[0]``) as a number and the unit it reads best in, picked after rounding.

    A number of a unit has ``digits`` significant digits, or all its integer digits when they are
    more (``1010`` of a binary unit); one that rounds to ``step`` or more moves to the next unit.
    """
    for i, unit in enumerate(units):
        last = i == len(units) - 1
        if not last and abs(v) >= step:
            v /= step
            continue
        whole = 10**digits - 0.5 <= abs(v)
        text = f"{v:.0f}" if whole else _plain(v, digits)
        if last or abs(float(text)) < step:
            return text, unit
        v /= step
        if abs(v) < 1:  # rounded up to the next unit's 1
            v = math.copysign(1.0, v)
    raise AssertionError("unreachable: the last unit always returns")  # pragma: no cover
