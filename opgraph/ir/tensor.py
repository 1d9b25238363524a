"""Tensor descriptions (shape, dtype, optional strides, a tensor id for data flow) and :class:`FrozenModel`,
the base record of every saved IR type."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from opgraph.ir.dtypes import DType

NonNegInt = Annotated[int, Field(ge=0)]
"""An integer that is zero or more (sizes, counts, FLOPs, bytes)."""

FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
"""Model config shared by every saved IR type: immutable, no unknown fields, documented schema."""


class FrozenModel(BaseModel):
    """Base of every saved record: a pydantic model with the :data:`FROZEN` config."""

    model_config = FROZEN

    reads_unversioned: ClassVar[bool] = False
    """For a type with a ``schema_version`` field: a file without one (written before the type had a
    version, or by hand) reads as its oldest version; off, such a file is refused as too old
    (:func:`opgraph.ir.io.check_schema_version`)."""


class TensorSpec(FrozenModel):
    """One tensor an op reads or writes."""

    shape: tuple[NonNegInt, ...]
    """Sizes of each dimension; ``()`` for a scalar."""
    dtype: DType
    """Element type."""
    strides: tuple[int, ...] | None = None
    """Strides in elements, when known and not contiguous."""
    id: int | None = None
    """Identity of the storage-level value for data flow; views share their base's id."""

    @model_validator(mode="after")
    def _strides_match_rank(self) -> TensorSpec:
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ValueError(f"strides has {len(self.strides)} entries but shape has {len(self.shape)}")
        return self

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor's elements occupy (rounded up)."""
        return math.ceil(self.numel * self.dtype.itemsize)
