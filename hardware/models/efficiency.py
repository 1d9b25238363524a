"""Size-dependent efficiency: the fraction of a peak an op reaches, and the roofline's tunable parameters.

An :class:`EfficiencyCurve` goes through ``(size, efficiency)`` points, linear in ``log(size)``
between them and flat beyond the ends. Its points must keep time non-decreasing in size
(efficiency may not grow faster than size), so a bigger op never costs less.
:class:`RooflineParams` gathers every number the roofline model assumes; calibration fits them.
"""

from __future__ import annotations

import bisect
import math
from typing import Annotated

from pydantic import Field, model_validator

from opgraph.ir import OpKind
from opgraph.ir.tensor import FrozenModel

Fraction = Annotated[float, Field(gt=0, le=1)]
"""A fraction in (0, 1]."""
PosSize = Annotated[float, Field(gt=0)]
"""A size above zero."""


class EfficiencyCurve(FrozenModel):
    """Achieved fraction of peak as a function of size (bytes or FLOPs), log-linear between points."""

    points: tuple[tuple[PosSize, Fraction], ...]
    """``(size, efficiency)`` pairs, sizes strictly increasing."""

    @model_validator(mode="after")
    def _check(self) -> EfficiencyCurve:
        if not self.points:
            raise ValueError("an efficiency curve needs at least one point")
        for (s0, e0), (s1, e1) in zip(self.points, self.points[1:], strict=False):
            if s1 <= s0:
                raise ValueError(f"sizes must increase: {s1:g} follows {s0:g}")
            if e1 / e0 > s1 / s0 * (1 + 1e-9):
                raise ValueError(
                    f"efficiency grows faster than size between {s0:g} and {s1:g}, so a bigger op would cost less"
                )
        return self

    @classmethod
    def constant(cls, efficiency: float) -> EfficiencyCurve:
        """A flat curve."""
        return cls(points=((1.0, efficiency),))

    def __call__(self, size: float) -> float:
        """The efficiency at ``size``."""
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([p[0] for p in pts], size)
        (s0, e0), (s1, e1) = pts[i - 1], pts[i]
        t = math.log(size / s0) / math.log(s1 / s0)
        return e0 + (e1 - e0) * t


class GemmTile(FrozenModel):
    """A CTA tile shape a GEMM library may pick, with the fraction of per-SM peak it sustains."""

    m: Annotated[int, Field(ge=1)]
    """Rows of the output tile."""
    n: Annotated[int, Field(ge=1)]
    """Columns of the output tile."""
    efficiency: Fraction
    """Fraction of one SM's tensor peak a tile of this shape sustains in its main loop."""
    max_problem_m: Annotated[int, Field(ge=1)] | None = None
    """Only considered for problems with at most this many rows (skinny-M kernels)."""


def _default_tiles() -> tuple[GemmTile, ...]:
    # Hopper-class cuBLAS/CUTLASS shapes. The big tile sustains ~85% of peak; smaller tiles lose
    # operand reuse (intensity ~ m*n/(m+n)), which is why a 1024^3 GEMM that fills only a quarter of
    # an H100's SMs with big tiles is no better off with small ones.
    return (
        GemmTile(m=128, n=256, efficiency=0.85),
        GemmTile(m=128, n=128, efficiency=0.45),
        GemmTile(m=64, n=128, efficiency=0.4, max_problem_m=64),
        GemmTile(m=64, n=64, efficiency=0.3, max_problem_m=64),
    )


def _default_memory_curve() -> EfficiencyCurve:
    # Fraction of HBM bandwidth by bytes moved: small transfers cannot keep enough requests in
    # flight; streams of hundreds of MiB reach ~90% (a 1 GiB copy on H100).
    mib = 2.0**20
    return EfficiencyCurve(points=((0.25 * mib, 0.25), (2 * mib, 0.55), (32 * mib, 0.85), (512 * mib, 0.9)))


def _default_memory_scale() -> dict[OpKind, float]:
    # Access patterns worse than a stream: gathers, sorts, scattered routing.
    return {
        OpKind.EMBEDDING: 0.7,
        OpKind.TOPK: 0.5,
        OpKind.MOE_ROUTING: 0.6,
        OpKind.REDUCTION: 0.9,
        OpKind.SOFTMAX: 0.9,
        OpKind.NORM: 0.9,
    }


class RooflineParams(FrozenModel):
    """Every assumption of the roofline model; defaults suit Hopper-class GPUs and libraries."""

    gemm_tiles: tuple[GemmTile, ...] = Field(default_factory=_default_tiles, min_length=1)
    """Candidate tiles; the model takes the fastest (as a library's heuristic would)."""
    gemm_k_overhead: Annotated[int, Field(ge=0)] = 128
    """Prologue/epilogue of one tile, in units of ``k`` (short reductions are far from peak)."""
    gemm_split_k_max_m: Annotated[int, Field(ge=0)] = 256
    """Split-K is considered for problems with at most this many rows (decode, small batches)."""
    gemm_max_split_k: Annotated[int, Field(ge=1)] = 16
    """Largest split-K factor."""
    attention_efficiency: Fraction = 0.5
    """Fraction of tensor peak a fused attention kernel reaches on long sequences (FA2/cuDNN on H100)."""
    attention_block_q: Annotated[int, Field(ge=1)] = 128
    """Query rows per CTA of a fused attention kernel."""
    attention_kv_overhead: Annotated[int, Field(ge=0)] = 128
    """Fixed cost of one CTA, in keys (short attention is far from peak)."""
    vector_efficiency: Fraction = 0.6
    """Fraction of vector peak reached by pointwise arithmetic."""
    memory_curve: EfficiencyCurve = Field(default_factory=_default_memory_curve)
    """Fraction of memory bandwidth reached, by bytes moved."""
    memory_curves: dict[OpKind, EfficiencyCurve] = Field(default_factory=dict)
    """Per-kind curves replacing ``memory_curve`` (fitted by calibration)."""
    memory_scale: dict[OpKind, float] = Field(default_factory=_default_memory_scale)
    """Per-kind factors on the memory curve for access patterns worse than a stream."""
    time_scale: dict[OpKind, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    """Per-kind multipliers on the final time (calibration's simplest correction)."""
    launch_latency_us: Annotated[float, Field(ge=0)] | None = None
    """Override of the device's launch latency."""
    allow_tf32: bool = False
    """Run fp32 GEMMs on TF32 tensor cores (PyTorch's default is not to)."""
    cost_other: bool = True
    """Cost unrecognised ``other`` ops from their FLOPs and bytes; when off they are reported uncosted."""

    @model_validator(mode="after")
    def _check_scales(self) -> RooflineParams:
        for kind, value in self.memory_scale.items():
            if not 0 < value <= 1:
                raise ValueError(f"memory_scale[{kind.value}] must be in (0, 1], got {value}")
        return self

    def memory_efficiency(self, kind: OpKind | str, nbytes: float) -> float:
        """Fraction of memory bandwidth an op of ``kind`` moving ``nbytes`` reaches (a kind outside
        :class:`~opgraph.ir.OpKind`, a user's, gets the default curve)."""
        k = builtin_kind(kind)
        if k is None:
            return self.memory_curve(nbytes)
        return self.memory_curves.get(k, self.memory_curve)(nbytes) * self.memory_scale.get(k, 1.0)

    def time_factor(self, kind: OpKind | str) -> float:
        """The per-kind ``time_scale`` multiplier (1 when the kind has none)."""
        k = builtin_kind(kind)
        return 1.0 if k is None else self.time_scale.get(k, 1.0)


def builtin_kind(kind: OpKind | str) -> OpKind | None:
    """``kind`` as a built-in :class:`~opgraph.ir.OpKind`, or ``None`` for a kind outside it."""
    try:
        return OpKind(kind)
    except ValueError:
        return None
