"""``HardwareSpec``: what a device can do, as datasheet numbers (dense, not sparse)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from hardware.units import parse_quantity
from opgraph.ir import DType
from opgraph.ir.tensor import FrozenModel

PosFloat = Annotated[float, Field(gt=0)]
"""A float above zero."""
NonNegFloat = Annotated[float, Field(ge=0)]
"""A float of zero or more."""


class DeviceKind(str, Enum):
    """Broad class of device."""

    GPU = "gpu"
    CPU = "cpu"
    ACCELERATOR = "accelerator"


class PeakFlops(FrozenModel):
    """Peak dense FLOP/s per dtype on one kind of unit; a missing dtype is not supported there.

    Values are numbers in FLOP/s or strings with a unit (``"989.4 TFLOP/s"``, ``"1979 TOPS"``).
    """

    fp64: PosFloat | None = None
    fp32: PosFloat | None = None
    tf32: PosFloat | None = None
    bf16: PosFloat | None = None
    fp16: PosFloat | None = None
    fp8: PosFloat | None = None
    """FP8 (e4m3/e5m2)."""
    int8: PosFloat | None = None
    """INT8 operations per second."""
    fp4: PosFloat | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _units(cls, value: object) -> object:
        return parse_quantity(value, "flops")


class HostOverhead(FrozenModel):
    """CPU time the framework spends to issue one op (Python + dispatcher + launch call)."""

    eager_us: NonNegFloat = 10.0
    """Per op in eager PyTorch (HF transformers style)."""
    cuda_graph_us: NonNegFloat = 0.5
    """Per op when replayed from a CUDA graph."""


class Interconnect(FrozenModel):
    """Links between devices of one node and to the host."""

    name: str = ""
    """Link technology (NVLink4, xGMI, PCIe5)."""
    bandwidth: NonNegFloat = 0.0
    """Device-to-device bandwidth per direction, bytes/s (0: no direct link)."""
    latency_us: NonNegFloat = 0.0
    """Per-message latency between devices."""
    pcie_bandwidth: NonNegFloat = 0.0
    """Host link bandwidth per direction, bytes/s."""
    pcie_latency_us: NonNegFloat = 0.0
    """Host link latency."""

    @field_validator("bandwidth", "pcie_bandwidth", mode="before")
    @classmethod
    def _units(cls, value: object) -> object:
        return parse_quantity(value, "bandwidth")


class HardwareSpec(FrozenModel):
    """One device: compute peaks, memory, caches, launch and host costs, interconnect."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version, optional in a file written by hand (read as 1); the loader refuses newer versions with a clear
    message."""
    name: str
    """Catalog key (``h100-sxm``)."""
    vendor: str = ""
    """NVIDIA, AMD, Intel..."""
    kind: DeviceKind = DeviceKind.GPU
    description: str = ""
    """Full product name."""
    tensor: PeakFlops = Field(default_factory=PeakFlops)
    """Peak dense FLOP/s on matrix units (tensor cores, matrix cores, AMX)."""
    vector: PeakFlops = Field(default_factory=PeakFlops)
    """Peak FLOP/s on vector units (CUDA cores, SIMD)."""
    memory_bytes: PosFloat
    """Device memory capacity, bytes (a number, or a string with a unit: ``"80 GiB"``)."""
    memory_bandwidth: PosFloat
    """Peak device memory bandwidth, bytes/s (or ``"3.35 TB/s"``)."""
    l2_bytes: NonNegFloat = 0.0
    """Last-level on-chip cache, bytes (or ``"50 MB"``)."""
    sm_count: Annotated[int, Field(ge=1)] = 1
    """Streaming multiprocessors / compute units / cores."""
    launch_latency_us: NonNegFloat = 2.0
    """Smallest time one kernel occupies the device (launch + tail), microseconds."""
    host: HostOverhead = Field(default_factory=HostOverhead)
    """Framework overhead per op on the host."""
    interconnect: Interconnect = Field(default_factory=Interconnect)
    """Device links."""
    sources: tuple[str, ...] = ()
    """Where the numbers come from (datasheet URLs, measurements)."""
    aliases: tuple[str, ...] = ()
    """Other names the catalog finds this device by (``h100`` for ``h100-sxm``), compared case-insensitively."""
    notes: tuple[str, ...] = ()
    """Caveats about the numbers (estimates, assumptions)."""

    @field_validator("memory_bytes", "l2_bytes", mode="before")
    @classmethod
    def _byte_units(cls, value: object) -> object:
        return parse_quantity(value, "bytes")

    @field_validator("memory_bandwidth", mode="before")
    @classmethod
    def _bandwidth_units(cls, value: object) -> object:
        return parse_quantity(value, "bandwidth")

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name must not be empty")
        return value.strip()

    def ridge_point(self, dtype: DType = DType.bf16) -> float:
        """FLOPs per byte above which an op is compute-bound on tensor units (peak FLOP/s / bandwidth)."""
        return self.peak_flops(dtype) / self.memory_bandwidth

    def peak_flops(self, dtype: DType, *, tensor: bool = True) -> float:
        """Peak FLOP/s for ``dtype`` on tensor (or vector) units, falling back sensibly.

        fp8 falls back to bf16 and fp32 on tensor units to tf32; a dtype with no entry on tensor
        units falls back to the vector units, and the vector units to fp32 vector.
        """
        units = self.tensor if tensor else self.vector
        key = _FLOPS_KEY.get(dtype, "fp32")
        for k in (key, *_FALLBACK.get(key, ())):
            v = getattr(units, k)
            if v:
                return float(v)
        if tensor:
            return self.peak_flops(dtype, tensor=False)
        return float(self.vector.fp32 or self.tensor.fp32 or self.tensor.tf32 or 1e12)


_FLOPS_KEY: dict[DType, str] = {
    DType.fp64: "fp64",
    DType.fp32: "fp32",
    DType.tf32: "tf32",
    DType.bf16: "bf16",
    DType.fp16: "fp16",
    DType.fp8_e4m3: "fp8",
    DType.fp8_e5m2: "fp8",
    DType.fp4: "fp4",
    DType.int8: "int8",
    DType.uint8: "int8",
}
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("tf32",),
    "fp8": ("bf16", "fp16"),
    "fp4": ("fp8", "bf16"),
    "int8": ("fp8", "bf16"),
    "fp16": ("bf16",),
    "bf16": ("fp16",),
}
