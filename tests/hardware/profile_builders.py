"""Synthetic device profiles built from known efficiencies (the profile model must recover them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from hardware import DeviceProfile, HardwareSpec, ProfileDevice, ProfilePoint
from hardware.models.profile import roofline_seconds
from opgraph.ir import DType, Gemm, Norm, OpBase
from validators import config_key

M_SIZES = tuple(2**i for i in range(0, 13, 2))  # 1, 4, ..., 4096
NK = ((4096, 4096), (14336, 4096), (4096, 14336))


def gemm_eff(m: int, n: int, k: int, dtype: DType = DType.bf16) -> float:
    """A known efficiency, log-linear in log2 m (so interpolation along m recovers it exactly)."""
    scale = {DType.bf16: 1.0, DType.fp16: 0.5, DType.fp32: 0.25}[dtype]
    return scale * math.exp(-4.0 + 0.3 * math.log2(m)) * (1.0 + 0.1 * math.log2(n / 4096))


def norm_eff(nbytes: int) -> float:
    """A known memory-bound efficiency, log-linear in log2 bytes."""
    return math.exp(-6.0 + 0.25 * math.log2(nbytes))


def point(op: OpBase, eff: float, hw: HardwareSpec, host_s: float | None = None, tag: str = "") -> ProfilePoint:
    """The point an op of efficiency ``eff`` would have measured on ``hw``."""
    data = {"key": config_key(op) + tag, "op": op, "seconds": roofline_seconds(op, hw) / eff, "host_s": host_s}
    return ProfilePoint.model_validate({**data, "tag": tag})


def gemm_points(
    hw: HardwareSpec,
    ms: Iterable[int] = M_SIZES,
    nks: Iterable[tuple[int, int]] = NK,
    dtype: DType = DType.bf16,
    eff: Callable[[int, int, int, DType], float] = gemm_eff,
    host_s: float | None = 30e-6,
) -> list[ProfilePoint]:
    """GEMM points over ``ms`` x ``nks``."""
    return [point(Gemm(id=0, m=m, n=n, k=k, dtype=dtype), eff(m, n, k, dtype), hw, host_s) for n, k in nks for m in ms]


def norm_points(hw: HardwareSpec, rows: Iterable[int] = (1, 16, 256, 4096), hidden: int = 4096) -> list[ProfilePoint]:
    """RMSNorm points over ``rows``."""
    out = []
    for r in rows:
        op = Norm(id=0, rows=r, hidden=hidden)
        out.append(point(op, norm_eff(op.total_bytes), hw, 50e-6))
    return out


def synthetic_profile(
    hw: HardwareSpec, points: Iterable[ProfilePoint] | None = None, *, hardware: str | None = None, **fields: object
) -> DeviceProfile:
    """A profile of ``points`` (GEMMs and norms by default) said to be measured on ``hardware`` (``hw``'s name)."""
    pts = list(points) if points is not None else [*gemm_points(hw), *norm_points(hw)]
    device = ProfileDevice(name="Synthetic GPU", hardware=hw.name if hardware is None else hardware)
    return DeviceProfile.model_validate(
        {"device": device, "points": tuple(pts), "planned": len(pts), "launch_us": 2.0, "aten_issue_us": 20.0, **fields}
    )
