"""Element types of tensors in the IR, with their sizes."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
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
        return _INFO[self].itemsize

    @property
    def is_float(self) -> builtins.bool:
        """True for floating-point types."""
        return _INFO[self].is_float

    @property
    def torch_name(self) -> str | None:
        """Name of the torch dtype that holds it (``bfloat16``; ``float32`` for tf32), if torch has one."""
        return _INFO[self].torch


@dataclass(frozen=True)
class _Info:
    itemsize: float
    is_float: builtins.bool
    torch: str | None
    """The torch dtype's name (``torch.<name>``)."""
    aliases: tuple[str, ...] = ()
    """Other torch names that map to this type."""


# The one table of element types: size, float or not, and torch names both ways.
_INFO: dict[DType, _Info] = {
    DType.fp64: _Info(8, True, "float64", ("double",)),
    DType.fp32: _Info(4, True, "float32", ("float",)),
    DType.tf32: _Info(4, True, "float32"),  # fp32 storage; torch.float32 maps back to fp32
    DType.bf16: _Info(2, True, "bfloat16"),
    DType.fp16: _Info(2, True, "float16", ("half",)),
    DType.fp8_e4m3: _Info(1, True, "float8_e4m3fn", ("float8_e4m3fnuz",)),
    DType.fp8_e5m2: _Info(1, True, "float8_e5m2", ("float8_e5m2fnuz",)),
    DType.fp4: _Info(0.5, True, "float4_e2m1fn_x2"),
    DType.int64: _Info(8, False, "int64", ("long",)),
    DType.int32: _Info(4, False, "int32", ("int",)),
    DType.int16: _Info(2, False, "int16"),
    DType.int8: _Info(1, False, "int8"),
    DType.uint8: _Info(1, False, "uint8"),
    DType.bool: _Info(1, False, "bool"),
    DType.complex64: _Info(8, False, "complex64"),
    DType.complex128: _Info(16, False, "complex128"),
}

TORCH_DTYPE_NAMES: dict[str, DType] = {}
"""torch dtype names (``str(torch.bfloat16)`` without ``torch.``) to :class:`DType`."""
for _dtype, _info in _INFO.items():
    for _name in (_info.torch, *_info.aliases):
        if _name is not None:
            TORCH_DTYPE_NAMES.setdefault(_name, _dtype)  # float32 stays fp32, not tf32

FLOAT_NAMES: frozenset[str] = frozenset(d.value for d in DType if d.is_float)
"""Names of the floating-point types (``bf16``)."""


def dtype_from_torch_name(name: str) -> DType:
    """Map ``torch.bfloat16`` / ``"bfloat16"`` style names to :class:`DType`; unknown -> ValueError."""
    key = name.removeprefix("torch.")
    try:
        return TORCH_DTYPE_NAMES[key]
    except KeyError:
        raise ValueError(f"unknown torch dtype {name!r}") from None
