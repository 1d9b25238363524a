"""The table model: measured times by op ``definition`` and shape, and the file calibration writes.

A :class:`CostTable` (saved as JSON) holds what ``opgraph calibrate`` learns from replay results:

- ``entries``: the median measured time of each replayed config, keyed by ``definition``, dtype
  and shape (the op's integer fields: ``m``, ``q_len``, ``rows``...), with the spread and the
  sample count;
- ``hardware``: the spec of the device it was measured on, with fitted launch latency and host
  overheads, so ``--hardware calib.json`` and ``--cost-model calib.json`` name one file;
- ``roofline`` and ``collective``: fitted parameters (per-kind efficiency curves, time scales) of
  the fallback model that costs every op the table does not hold.

:class:`TableModel` looks an op up: an exact shape gives the measured time; another shape of a
measured definition is interpolated linearly in the op's work (FLOPs for matmuls, bytes for the
rest) between the nearest measured shapes; outside the measured range it is the fallback's time
scaled by the efficiency (measured / fallback time) at the nearest measured shape, so a GEMM
measured only at decode sizes (memory-bound) is not scaled by FLOPs into a prefill (compute-bound).
Such costs say "extrapolated" in their detail, and a shape more than :data:`FAR_EXTRAPOLATION`
times outside the range raises a :class:`TableExtrapolationWarning` once per model. An unmeasured
definition goes to the fallback model. A ``_grouped_mm`` expert GEMM's time, measured by replay with
even loads, pays a router's uneven row tiles (:func:`~hardware.models.profile.router_tiles`), as in the
profile model.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from hardware.base import Bound, Cost, CostModel, CostModelError, CostModelWarning, UncostedOpError
from hardware.models.collective import AlphaBetaCollectiveModel, CollectiveParams
from hardware.models.efficiency import RooflineParams
from hardware.models.options import flag
from hardware.models.profile import router_tiles
from hardware.models.registry import resolve_cost_model
from hardware.spec import HardwareSpec, NonNegFloat
from opgraph.ir import DType, OpBase, OpCategory, OpgraphError, OpKind, Scalar, load_model, save_model
from opgraph.ir.tensor import FrozenModel

_COMMON_FIELDS = frozenset(OpBase.model_fields) | {"kind"}


def shape_key(op: OpBase) -> dict[str, int]:
    """The integer (and boolean) fields of ``op`` beyond the common ones: what tells shapes apart."""
    out: dict[str, int] = {}
    for name in type(op).model_fields:
        if name in _COMMON_FIELDS:
            continue
        value = getattr(op, name)
        if isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, int):
            out[name] = value
    return out


def table_work(op: OpBase) -> float:
    """The size coordinate the table interpolates along: FLOPs for matmuls, bytes moved for the rest."""
    kind = getattr(op, "kind", OpKind.OTHER)
    if kind in OpCategory.MATMUL and op.flops > 0:
        return float(op.flops)
    return float(op.total_bytes or op.flops)


FAR_EXTRAPOLATION = 4.0
"""Work this many times beyond the measured range makes :class:`TableModel` warn (once per model)."""

_DERIVED = frozenset({"flops", "bytes_read", "bytes_written", "definition", "inputs", "outputs", "call"})


class TableExtrapolationWarning(CostModelWarning):
    """A table predicts a shape far outside the range of work it measured (see :data:`FAR_EXTRAPOLATION`)."""


def _from_fields(op: OpBase, shape: dict[str, int] | None = None) -> OpBase:
    """``op`` rebuilt from its fields (with ``shape``'s values), its FLOPs and bytes derived again, so that
    the query and a measured shape are costed the same way."""
    data = op.model_dump(exclude=set(_DERIVED))
    return type(op).model_validate({**data, **(shape or {})})


class TableEntry(FrozenModel):
    """One measured config: the median device time of an op shape."""

    definition: str
    """The op's definition name (``gemm_n4096_k4096``)."""
    kind: OpKind
    """The op's kind."""
    dtype: DType = DType.bf16
    """Compute dtype."""
    shape: dict[str, int] = Field(default_factory=dict)
    """The op's integer fields (``m``, ``batch``, ``q_len``...), see :func:`shape_key`."""
    work: NonNegFloat = 0.0
    """FLOPs (matmuls) or bytes moved (the rest): the interpolation coordinate."""
    seconds: NonNegFloat
    """Median measured device time."""
    spread_s: NonNegFloat = 0.0
    """Spread of the measurements (interquartile range), seconds."""
    samples: Annotated[int, Field(ge=1)] = 1
    """Timed repetitions behind the median."""
    host_seconds: NonNegFloat | None = None
    """Measured host time to issue the op (eager PyTorch), when replay recorded it."""

    @classmethod
    def from_op(
        cls,
        op: OpBase,
        seconds: float,
        *,
        spread_s: float = 0.0,
        samples: int = 1,
        host_seconds: float | None = None,
    ) -> TableEntry:
        """The entry for a measured ``op``."""
        return cls(
            host_seconds=host_seconds,
            definition=op.definition,
            kind=OpKind(getattr(op, "kind", OpKind.OTHER)),
            dtype=op.dtype,
            shape=shape_key(op),
            work=table_work(op),
            seconds=seconds,
            spread_s=spread_s,
            samples=samples,
        )


class CostTable(FrozenModel):
    """A calibrated cost model as a file: measured times, the device spec, fallback parameters."""

    schema_version: Literal[1] = 1
    """Format version."""
    format: Literal["opgraph.cost_table"] = "opgraph.cost_table"
    """Marks the file as a cost table (so ``--hardware`` and ``--cost-model`` recognise it)."""
    hardware: HardwareSpec | None = None
    """The device measured, with fitted launch latency and host overheads."""
    entries: tuple[TableEntry, ...] = ()
    """Measured configs."""
    fallback: str = "roofline"
    """Model for ops not in the table: a built-in name or ``module:Class``."""
    roofline: RooflineParams = Field(default_factory=RooflineParams)
    """Parameters of the roofline fallback (fitted efficiency curves and time scales)."""
    collective: CollectiveParams = Field(default_factory=CollectiveParams)
    """Parameters of the collective model."""
    source: dict[str, Scalar] = Field(default_factory=dict)
    """Provenance: replay file, device name, library versions, date."""
    notes: tuple[str, ...] = ()
    """Free-form remarks."""

    @model_validator(mode="after")
    def _unique(self) -> CostTable:
        seen: set[tuple[str, DType, tuple[tuple[str, int], ...]]] = set()
        for e in self.entries:
            key = (e.definition, e.dtype, tuple(sorted(e.shape.items())))
            if key in seen:
                raise ValueError(f"entry {e.definition} {e.dtype.value} {e.shape} appears twice")
            seen.add(key)
        return self

    @classmethod
    def from_measurements(
        cls, measured: Iterable[tuple[OpBase, float]], *, hardware: HardwareSpec | None = None, **fields: object
    ) -> CostTable:
        """A table from ``(op, seconds)`` pairs; repeated shapes keep the median of their times."""
        groups: dict[tuple[str, DType, tuple[tuple[str, int], ...]], tuple[OpBase, list[float]]] = {}
        for op, seconds in measured:
            key = (op.definition, op.dtype, tuple(sorted(shape_key(op).items())))
            groups.setdefault(key, (op, []))[1].append(seconds)
        entries = []
        for op, times in groups.values():
            times.sort()
            mid = len(times) // 2
            median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
            entries.append(TableEntry.from_op(op, median, samples=len(times)))
        return cls.model_validate({**fields, "hardware": hardware, "entries": tuple(entries)})

    def save(self, path: str | Path) -> Path:
        """Write the table as JSON (``.gz`` compresses), atomically."""
        return save_model(self, path)

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """Read a table; every failure is a one-line :class:`~opgraph.ir.LoadError` naming the file."""
        return load_model(path, cls)


class _Series:
    """The measured shapes of one (definition, dtype), sorted by work."""

    def __init__(self) -> None:
        self.entries: list[TableEntry] = []

    def finish(self) -> None:
        merged: dict[float, list[float]] = {}
        for e in self.entries:
            merged.setdefault(e.work, []).append(e.seconds)
        self.points = sorted((w, sum(s) / len(s)) for w, s in merged.items())
        self.works = [w for w, _ in self.points]
        by_work = sorted(self.entries, key=lambda e: e.work)
        self.ends = (by_work[0], by_work[-1])
        """The measured shapes at the smallest and the largest work (extrapolation starts from them)."""

    def interpolate(self, work: float) -> float | None:
        """Linear in work between the two measured shapes around ``work``; ``None`` outside the range."""
        pts = self.points
        if not pts[0][0] <= work <= pts[-1][0]:
            return None
        if len(pts) == 1:
            return pts[0][1]
        i = min(bisect.bisect_right(self.works, work), len(pts) - 1)
        (w0, t0), (w1, t1) = pts[i - 1], pts[i]
        return t0 + (t1 - t0) * (work - w0) / (w1 - w0)


class TableModel:
    """Measured times by definition and shape, interpolated, with a fallback for the rest.

    Parameters
    ----------
    table:
        A :class:`CostTable` or the path of one (``path=`` is the same, for option strings).
    fallback:
        A cost model or spec for ops the table lacks; by default the table's ``fallback`` built
        with its fitted ``roofline`` and ``collective`` parameters.
    check_hardware:
        Refuse to cost for a device other than the one measured (names compared loosely).
    """

    name = "table"

    def __init__(
        self,
        table: CostTable | str | Path | None = None,
        *,
        path: str | Path | None = None,
        fallback: CostModel | str | None = None,
        check_hardware: bool | str = True,
    ) -> None:
        source = table if table is not None else path
        if source is None:
            raise CostModelError(
                "the table model needs a cost table file", hint="give path=FILE, or the .json file itself"
            )
        self.path = None if isinstance(source, CostTable) else str(source)
        self.table = source if isinstance(source, CostTable) else CostTable.load(source)
        self.check_hardware = flag(check_hardware)
        self.collective = AlphaBetaCollectiveModel(self.table.collective)
        self.fallback = self._make_fallback(fallback)
        self._warned_far = False
        self._exact: dict[tuple[str, DType, tuple[tuple[str, int], ...]], TableEntry] = {}
        self._series: dict[tuple[str, DType], _Series] = {}
        for e in self.table.entries:
            self._exact[(e.definition, e.dtype, tuple(sorted(e.shape.items())))] = e
            self._series.setdefault((e.definition, e.dtype), _Series()).entries.append(e)
        for series in self._series.values():
            series.finish()
        hosts: dict[str, list[float]] = {}
        for e in self.table.entries:
            if e.host_seconds is not None:
                hosts.setdefault(e.definition, []).append(e.host_seconds)
        # Host time barely depends on shape: other shapes of a definition take the median measured one.
        self._host: dict[str, float] = {d: sorted(v)[len(v) // 2] for d, v in hosts.items()}

    def _make_fallback(self, fallback: CostModel | str | None) -> CostModel:
        if fallback is not None and not isinstance(fallback, str):
            return fallback
        name = fallback or self.table.fallback
        # The built-ins get the table's fitted parameters; anything else is built as it is.
        fitted: dict[str, dict[str, object]] = {
            "roofline": {"params": self.table.roofline, "collective": self.collective},
            "formula": {"collective": self.collective},
        }
        return resolve_cost_model(name, **fitted.get(name, {}))

    def _where(self) -> str:
        return self.path or "cost table"

    def _check(self, hw: HardwareSpec) -> None:
        measured = self.table.hardware
        if not self.check_hardware or measured is None:
            return
        from hardware.loader import normalize_name

        if normalize_name(measured.name) != normalize_name(hw.name):
            raise CostModelError(
                f"the table was measured on {measured.name!r}, not {hw.name!r}",
                where=self._where(),
                hint="simulate with --hardware set to the table file or that device, or pass check_hardware=false",
            )

    def _bound(self, op: OpBase, hw: HardwareSpec) -> Bound:
        try:
            return self.fallback.estimate(op, hw).bound
        except (UncostedOpError, CostModelError):
            return Bound.COMPUTE if getattr(op, "kind", None) in OpCategory.MATMUL else Bound.MEMORY

    def _extrapolate(self, op: OpBase, hw: HardwareSpec, series: _Series, work: float) -> tuple[float, str]:
        """A shape outside the measured range: the fallback's time scaled by the efficiency (measured /
        fallback time) at the nearest measured shape, so a regime boundary (memory- to compute-bound)
        between the two is the fallback's to model, never a measured time scaled by work."""
        above = work > series.works[-1]
        edge = series.ends[1] if above else series.ends[0]
        edge_s = series.points[-1][1] if above else series.points[0][1]
        side = "above" if above else "below"
        far = work / edge.work if above else (edge.work / work if work > 0 else math.inf)
        try:
            query = self.fallback.estimate(_from_fields(op), hw).seconds
            at_edge = self.fallback.estimate(_from_fields(op, edge.shape), hw).seconds
        except (UncostedOpError, CostModelError, ValidationError) as exc:
            why = exc.message if isinstance(exc, OpgraphError) else str(exc).splitlines()[0]
            raise UncostedOpError(
                f"{op.definition} lies {side} the shapes the table measured and its fallback cannot cost it: {why}",
                where=self._where(),
            ) from None
        efficiency = edge_s / at_edge if at_edge > 0 else 1.0
        shape = ", ".join(f"{k}={v}" for k, v in sorted(edge.shape.items()))
        edge_name = "past the largest" if above else "under the smallest"
        how = (
            f"{side} the measured range of {op.definition} ({far:.3g}x {edge_name} measured work): "
            f"fallback x {efficiency:.3f}, the efficiency measured at {shape}; extrapolated"
        )
        if far > FAR_EXTRAPOLATION and not self._warned_far:
            self._warned_far = True
            warnings.warn(
                f"the cost table {self._where()} extrapolates: {op.definition} at {far:.3g}x "
                f"{'more' if above else 'less'} work than it measured is predicted from its fallback scaled by the "
                "efficiency measured at the nearest shape (each such op's cost detail says 'extrapolated'); "
                "calibrate with shapes of this regime for measured times",
                TableExtrapolationWarning,
                stacklevel=3,
            )
        return query * efficiency, how

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The measured, interpolated or fallback time of ``op``."""
        kind = getattr(op, "kind", OpKind.OTHER)
        if kind is OpKind.VIEW:
            return Cost(0.0, Bound.FREE, detail="view: no kernel")
        self._check(hw)
        # Replay times a grouped expert GEMM with even loads; a router's cost more row tiles (router_tiles).
        tiles, tiles_note = router_tiles(op, hw)
        tiles_note = f"; {tiles_note}" if tiles_note else ""
        exact = self._exact.get((op.definition, op.dtype, tuple(sorted(shape_key(op).items()))))
        if exact is not None:
            return Cost(
                exact.seconds * tiles,
                self._bound(op, hw),
                detail=f"table: measured ({exact.samples} samples){tiles_note}",
                host_s=exact.host_seconds if exact.host_seconds is not None else self._host.get(op.definition),
            )
        series = self._series.get((op.definition, op.dtype))
        if series is not None:
            work = table_work(op)
            seconds = series.interpolate(work)
            how = f"interpolated between measured shapes of {op.definition}"
            if seconds is None:
                seconds, how = self._extrapolate(op, hw, series, work)
            return Cost(
                seconds * tiles,
                self._bound(op, hw),
                detail=f"table: {how}{tiles_note}",
                host_s=self._host.get(op.definition),
            )
        cost = self.fallback.estimate(op, hw)
        return dataclasses.replace(cost, detail=f"fallback (not in the table): {cost.detail}".rstrip(": "), host_s=None)


def load_cost_table(path: str | Path) -> CostTable:
    """Read a :class:`CostTable` file (alias of :meth:`CostTable.load`)."""
    return CostTable.load(path)
