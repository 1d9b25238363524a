"""``GraphIdentity``: which graph a record speaks of (model, architecture, phase), defined once."""

from __future__ import annotations

from typing import Any, Self

from opgraph.ir.graph import GraphMetadata
from opgraph.ir.tensor import FrozenModel


class GraphIdentity(FrozenModel):
    """The model, architecture and phase of a graph, as its :class:`GraphMetadata` names them.

    Saved records about a graph (a catalog's config sources, a coverage report) derive from it, so
    these three fields come first, in this order, with one meaning everywhere.
    """

    model: str
    """Model name, preset or path, from the graph's metadata."""
    architecture: str = ""
    """transformers architecture class (``LlamaForCausalLM``)."""
    phase: str = ""
    """Phase of the graph: ``prefill``, ``decode``, ``generate`` or ``trace``."""

    @classmethod
    def from_metadata(cls, metadata: GraphMetadata, /, **fields: Any) -> Self:
        """An instance with model, architecture and phase taken from ``metadata`` and its other fields
        from ``fields`` (which may also override the three, e.g. a ``model`` for an unnamed graph).

        >>> GraphIdentity.from_metadata(GraphMetadata(model="tiny", phase="decode"))
        GraphIdentity(model='tiny', architecture='', phase='decode')
        """
        taken = {"model": metadata.model, "architecture": metadata.architecture, "phase": metadata.phase}
        return cls(**{**taken, **fields})
