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

__all__ = ["fmt_bytes", "fmt_count", "fmt_pct", "fmt_us", "fmt_us_sig", "fmt_x"]


def fmt_us(value_us: float) -> str:
    """A duration given in microseconds, in the unit that reads best, fixed decimals (``1.234 ms``)."""
    v = float(value_us)
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3f} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3f} ms"
    return f"{v:.2f} us"


def fmt_us_sig(value_us: float, digits: int = 4) -> str:
    """A duration in microseconds with ``digits`` significant digits, in the unit that reads best."""
    v = float(value_us)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.{digits}g} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.{digits}g} ms"
    return f"{v:.{digits}g} us"


def fmt_count(value: float, unit: str = "") -> str:
    """``1.23 G``-style engineering format (k, M, G, T, P, E), three significant digits."""
    v = float(value)
    for prefix in ("", "k", "M", "G", "T", "P", "E"):
        if abs(v) < 1000 or prefix == "E":
            return f"{v:.3g} {prefix}{unit}".rstrip()
        v /= 1000
    return f"{v:.3g}"  # pragma: no cover - the loop always returns


def fmt_bytes(value: float) -> str:
    """Bytes in binary units (B, KiB, MiB, GiB, TiB, PiB), three significant digits."""
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(v) < 1024 or unit == "PiB":
            return f"{v:.3g} {unit}"
        v /= 1024
    return f"{v:.3g} PiB"  # pragma: no cover - the loop always returns


def fmt_pct(fraction: float) -> str:
    """A fraction as a percentage with one decimal (``0.1234`` -> ``12.3%``)."""
    return f"{fraction * 100:.1f}%"


def fmt_x(ratio: float) -> str:
    """A ratio as a factor with three significant digits (``2.0`` -> ``2x``)."""
    return f"{ratio:.3g}x"
