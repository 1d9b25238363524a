"""Helpers shared by subcommands: consoles, one-line errors, number formatting."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from opgraph.ir.errors import OpgraphError

P = ParamSpec("P")
R = TypeVar("R")

console = Console(highlight=False, soft_wrap=False)
"""Standard output console for tables and summaries."""


def err_console() -> Console:
    """A console on the current stderr (looked up per call so test runners can capture it)."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr as one line and return the Exit to raise."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(code)


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn :class:`OpgraphError` into one stderr line and exit 2; Ctrl-C into exit 130.

    Unexpected exceptions print one line too, unless ``OPGRAPH_DEBUG=1`` asks for the traceback.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except OpgraphError as exc:
            raise fail(exc.one_line()) from None
        except KeyboardInterrupt:
            raise fail("interrupted", code=130) from None
        except Exception as exc:
            if os.environ.get("OPGRAPH_DEBUG"):
                raise
            raise fail(
                f"internal error {type(exc).__name__}: {exc} (set OPGRAPH_DEBUG=1 for the traceback and report it)",
                code=1,
            ) from None

    return wrapper


def fmt_count(value: float, unit: str = "") -> str:
    """``1.23 G``-style engineering format (k, M, G, T, P)."""
    v = float(value)
    for prefix in ("", "k", "M", "G", "T", "P", "E"):
        if abs(v) < 1000 or prefix == "E":
            return f"{v:.3g} {prefix}{unit}".rstrip()
        v /= 1000
    return f"{v:.3g}"


def fmt_bytes(value: float) -> str:
    """Bytes in binary units (KiB, MiB, GiB)."""
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(v) < 1024 or unit == "PiB":
            return f"{v:.3g} {unit}"
        v /= 1024
    return f"{v:.3g} PiB"


def fmt_us(value_us: float) -> str:
    """A duration given in microseconds, in the unit that reads best."""
    v = float(value_us)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3f} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3f} ms"
    return f"{v:.2f} us"
