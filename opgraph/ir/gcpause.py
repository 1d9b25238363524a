"""Pausing the cyclic garbage collector while building large acyclic structures."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic GC inside the block (restored after).

    Capture, trace import, simulation and timeline building allocate hundreds of thousands of
    small objects and no cycles; with a large graph alive, each full collection rescans it, which
    can take longer than the work itself.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
