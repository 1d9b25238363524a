"""The formula model: the seed simulator's size-based durations, for engine studies.

The seed's ``TransformerOpSimulator`` gave each op ``elements x 0.5 us x factor``: matmuls by
multiply-accumulates at factor 0.001, residual adds 0.25, activations 0.1, RMSNorm three passes at
0.1, RoPE per head 0.15, softmax 0.1, KV-cache writes 0.15, anything else 0.1. This model keeps
those numbers (all options) so engine and scheduling studies match the seed, and adds what the
seed lacked: every op kind of the IR, free views, alpha-beta collectives, and an optional
``reference`` device so the same formula scales to hypothetical hardware (time x the reference's
peak FLOP/s or bandwidth / the device's).

Without a ``reference`` the formula ignores the simulated device's peaks altogether: its times are
the seed's constants, not a prediction for that device (a 70B prefill "takes" 20 hours on an H100).
It then says so, once per device, with a :class:`HardwareIgnoredWarning` (also in :meth:`FormulaModel.notes`).
"""

from __future__ import annotations

import math
import warnings
from typing import Annotated

from pydantic import Field

from hardware.base import Bound, Cost, CostModelWarning
from hardware.models.dispatch import (
    FormulaDispatchModel,
    collective_cost,
    kind_name,
    register_cost,
    view_cost,
)
from hardware.models.efficiency import builtin_kind
from hardware.spec import HardwareSpec
from opgraph.ir import (
    Activation,
    Attention,
    Elementwise,
    Gemm,
    Memory,
    Norm,
    OpBase,
    OpCategory,
    OpKind,
    Rope,
    Softmax,
)
from opgraph.ir.tensor import FrozenModel


class HardwareIgnoredWarning(CostModelWarning):
    """The formula model was asked to cost ops on a device whose peaks it does not use."""


def _default_factors() -> dict[OpKind, float]:
    return {
        OpKind.GEMM: 0.001,
        OpKind.ATTENTION: 0.001,
        OpKind.ELEMENTWISE: 0.25,
        OpKind.ACTIVATION: 0.1,
        OpKind.NORM: 0.3,
        OpKind.ROPE: 0.15,
        OpKind.SOFTMAX: 0.1,
        OpKind.MEMORY: 0.15,
    }


class FormulaParams(FrozenModel):
    """The formula's constants (the seed's values by default)."""

    base_us_per_element: Annotated[float, Field(gt=0)] = 0.5
    """Microseconds per element before the kind's factor."""
    factors: dict[OpKind, Annotated[float, Field(ge=0)]] = Field(default_factory=_default_factors)
    """Per-kind factor; kinds not listed use ``default_factor``."""
    default_factor: Annotated[float, Field(ge=0)] = 0.1
    """Factor of kinds not in ``factors``."""
    attention_softmax_factor: Annotated[float, Field(ge=0)] = 0.1
    """Factor on attention scores for the softmax the seed ran as separate stages."""
    min_us: Annotated[float, Field(ge=0)] = 0.0
    """Floor of every kernel's time."""
    truncate: bool = False
    """Round down to whole microseconds, as the seed did."""
    reference: str | None = None
    """A catalog device the constants describe; times then scale to the simulated device."""


class FormulaModel(FormulaDispatchModel[FormulaParams]):
    """``elements x base_us_per_element x factor[kind]`` microseconds (the seed's simulator).

    The element count of each kind is a cost formula registered under ``"formula"`` with
    :func:`~hardware.models.dispatch.register_cost`; a formula for your own op kind or class calls
    :meth:`from_elements`. ``formulas=`` overrides formulas for one model.
    """

    name = "formula"
    params_type = FormulaParams

    def setup(self) -> None:
        """Load the ``reference`` device, when one is named."""
        self._reference: HardwareSpec | None = None
        if self.params.reference is not None:
            from hardware.loader import load_hardware

            self._reference = load_hardware(self.params.reference)
        self._warned: set[str] = set()

    def notes(self, hw: HardwareSpec) -> tuple[str, ...]:
        """What a user must know about this model's times on ``hw`` (empty when it scales to ``hw``)."""
        if self._reference is not None:
            return ()
        return (
            f"the formula cost model ignores {hw.name}'s peak FLOP/s and memory bandwidth: its times are the "
            "seed simulator's size formulas (elements x 0.5 us x a per-kind factor), not a prediction for this "
            "device; use -c roofline or a calibrated table, or the option reference=DEVICE to scale the "
            "formula from the device its constants describe",
        )

    def from_elements(self, op: OpBase, hw: HardwareSpec, elements: float, extra_us: float = 0.0) -> Cost:
        """``elements x base_us_per_element x factor[kind] + extra_us``, scaled to ``hw`` from the
        ``reference`` device when there is one, truncated and floored as the options say."""
        if hw.name not in self._warned:
            self._warned.add(hw.name)
            for note in self.notes(hw):
                warnings.warn(note, HardwareIgnoredWarning, stacklevel=3)
        p = self.params
        kind = builtin_kind(kind_name(op))
        factor = p.factors.get(kind, p.default_factor) if kind is not None else p.default_factor
        us = elements * p.base_us_per_element * factor + extra_us
        compute_like = kind in OpCategory.MATMUL
        if self._reference is not None:
            if compute_like:
                us *= self._reference.peak_flops(op.dtype) / hw.peak_flops(op.dtype)
            else:
                us *= self._reference.memory_bandwidth / hw.memory_bandwidth
        if p.truncate:
            us = float(math.floor(us))
        us = max(us, p.min_us)
        bound = Bound.COMPUTE if compute_like else Bound.MEMORY
        return Cost(
            us * 1e-6,
            bound,
            compute_s=us * 1e-6 if compute_like else 0.0,
            memory_s=0.0 if compute_like else us * 1e-6,
            detail=f"formula: elements x {p.base_us_per_element} us x {factor}",
        )


# -- element counts per kind (multiply-accumulates for matmuls) ------------------------------------


register_cost(FormulaModel, OpKind.VIEW)(view_cost)
register_cost(FormulaModel, OpKind.COLLECTIVE)(collective_cost)


@register_cost(FormulaModel, OpKind.GEMM)
def _gemm(model: FormulaModel, op: Gemm, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.m * op.n * op.k * op.batch * op.groups))


@register_cost(FormulaModel, OpKind.ATTENTION)
def _attention(model: FormulaModel, op: Attention, hw: HardwareSpec) -> Cost:
    scores = op.batch * op.heads * op.pairs
    # The seed ran the softmax over the scores as separate stages.
    softmax_us = scores * model.params.base_us_per_element * model.params.attention_softmax_factor
    return model.from_elements(op, hw, float(scores * (op.head_dim + op.dv)), softmax_us)


@register_cost(FormulaModel, OpKind.NORM)
def _norm(model: FormulaModel, op: Norm, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.rows * op.hidden))


@register_cost(FormulaModel, OpKind.ROPE)
def _rope(model: FormulaModel, op: Rope, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.tokens * op.head_dim))  # the seed counted numel / heads


@register_cost(FormulaModel, OpKind.ACTIVATION, OpKind.ELEMENTWISE, OpKind.MEMORY)
def _numel(model: FormulaModel, op: Activation | Elementwise | Memory, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.numel))


@register_cost(FormulaModel, OpKind.SOFTMAX)
def _softmax(model: FormulaModel, op: Softmax, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.rows * op.cols))


@register_cost(FormulaModel, OpBase)
def _by_bytes(model: FormulaModel, op: OpBase, hw: HardwareSpec) -> Cost:
    """Any other kind: the larger of the elements read and written."""
    size = op.dtype.itemsize or 1
    return model.from_elements(op, hw, max(op.bytes_written, op.bytes_read) / size)
