"""Element types of tensors in the IR, with their sizes."""

from __future__ import annotations

import builtins
from enum import Enum


class DType(str, Enum):
    """Element type of a tensor. String values keep saved JSON stable."""

    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"
    fp4 = "fp4"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    uint8 = "uint8"
    bool = "bool"
    complex64 = "complex64"
    complex128 = "complex128"

    @property
    def itemsize(self) -> float:
        """Bytes per element (0.5 for 4-bit types)."""
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> builtins.bool:
        """True for floating-point types."""
        return self in _FLOATS


_ITEMSIZE: dict[DType, float] = {
    DType.fp64: 8,
    DType.fp32: 4,
    DType.tf32: 4,
    DType.bf16: 2,
    DType.fp16: 2,
    DType.fp8_e4m3: 1,
    DType.fp8_e5m2: 1,
    DType.fp4: 0.5,
    DType.int64: 8,
    DType.int32: 4,
    DType.int16: 2,
    DType.int8: 1,
    DType.uint8: 1,
    DType.bool: 1,
    DType.complex64: 8,
    DType.complex128: 16,
}
_FLOATS = frozenset(
    {DType.fp64, DType.fp32, DType.tf32, DType.bf16, DType.fp16, DType.fp8_e4m3, DType.fp8_e5m2, DType.fp4}
)

#: torch dtype names (``str(torch.bfloat16)`` without ``torch.``) to :class:`DType`.
TORCH_DTYPE_NAMES: dict[str, DType] = {
    "float64": DType.fp64,
    "double": DType.fp64,
    "float32": DType.fp32,
    "float": DType.fp32,
    "bfloat16": DType.bf16,
    "float16": DType.fp16,
    "half": DType.fp16,
    "float8_e4m3fn": DType.fp8_e4m3,
    "float8_e4m3fnuz": DType.fp8_e4m3,
    "float8_e5m2": DType.fp8_e5m2,
    "float8_e5m2fnuz": DType.fp8_e5m2,
    "float4_e2m1fn_x2": DType.fp4,
    "int64": DType.int64,
    "long": DType.int64,
    "int32": DType.int32,
    "int": DType.int32,
    "int16": DType.int16,
    "int8": DType.int8,
    "uint8": DType.uint8,
    "bool": DType.bool,
    "complex64": DType.complex64,
    "complex128": DType.complex128,
}


def dtype_from_torch_name(name: str) -> DType:
    """Map ``torch.bfloat16`` / ``"bfloat16"`` style names to :class:`DType`; unknown -> ValueError."""
    key = name.removeprefix("torch.")
    try:
        return TORCH_DTYPE_NAMES[key]
    except KeyError:
        raise ValueError(f"unknown torch dtype {name!r}") from None
