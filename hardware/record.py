"""The base of the hardware package's records: frozen, validated pydantic models."""

from __future__ import annotations

from pydantic import BaseModel

from opgraph.ir.tensor import FROZEN


class Record(BaseModel):
    """A frozen pydantic model that forbids unknown fields and reads each field's docstring as its
    description (:data:`opgraph.ir.tensor.FROZEN`). The hardware package's records derive from it
    instead of repeating the configuration."""

    model_config = FROZEN
