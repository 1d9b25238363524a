"""Module paths of a recording (``model.layers.3.mlp``): what they say about the op they scope."""

from __future__ import annotations

import re

_LAYER_RE = re.compile(r"\.(\d+)(?:\.|$)")


def layer_of(scope: str) -> int | None:
    """The transformer layer index in a module path (``model.layers.3.mlp`` -> 3), or ``None``.

    >>> layer_of("model.layers.3.mlp.experts"), layer_of("lm_head")
    (3, None)
    """
    m = _LAYER_RE.search(scope)
    return int(m.group(1)) if m else None


__all__ = ["layer_of"]
