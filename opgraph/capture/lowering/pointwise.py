"""``pointwise``: arithmetic PyTorch tags pointwise (add, mul, rsqrt, where, ...) to ``Elementwise``,
and reductions (sum, mean, amax, ...) to ``Reduction``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, last_dim, numel
from opgraph.ir.ops import OpKind, scalar_operand

_ELEMENTWISE_EXTRA = frozenset(
    {
        "masked_fill",
        "masked_fill_",
        "where",
        "clamp",
        "clamp_",
        "addcmul",
        "addcdiv",
        "lerp",
        "native_dropout",
        "dropout",
        "_softmax_backward_data",
        "polar",
        "outer",
        "index_add",
        "index_add_",
        "scatter_add",
        "scatter_add_",
        "_foreach_add",
        "_foreach_mul",
    }
)
_REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "prod",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "norm",
        "linalg_vector_norm",
        "cumsum",
        "cumprod",
        "any",
        "all",
        "logsumexp",
        "count_nonzero",
        "aminmax",
        "histc",
        "bincount",
    }
)


@dataclass(frozen=True)
class LowerPointwise:
    """``Elementwise`` and ``Reduction`` ops."""

    name: ClassVar[str] = "pointwise"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if not ev.outputs:
                continue
            out = ev.outputs[0]
            if ev.fn in _REDUCTIONS and ev.inputs:
                x = ev.inputs[0]
                n_in, n_out = numel(x), max(numel(out), 1)
                if ev.fn in ("max", "min") and len(ev.inputs) == 2 and ev.inputs[1].shape == x.shape:
                    lw.claim(
                        [ev.index],
                        OpKind.ELEMENTWISE,
                        {"fn": ev.fn, "numel": numel(out), "hidden": max(last_dim(out), 1)},
                    )
                    continue
                lw.claim(
                    [ev.index],
                    OpKind.REDUCTION,
                    {"fn": ev.fn, "numel_in": n_in, "numel_out": n_out, "reduced": max(1, n_in // n_out)},
                )
            elif ev.pointwise or ev.fn in _ELEMENTWISE_EXTRA:
                fn = ev.fn.rstrip("_") or ev.fn
                fields = {"fn": fn, "numel": numel(out), "hidden": max(last_dim(out), 1)}
                if scalar_operand(fn, [numel(r) for r in ev.inputs], numel(out)):
                    fields["scalar"] = True  # ``x * 0.125``: the other operand is a number or one element
                lw.claim([ev.index], OpKind.ELEMENTWISE, fields)
