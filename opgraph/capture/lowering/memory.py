"""``memory``: copies, casts, concatenation, indexing, scatter and fills."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, numel
from opgraph.capture.recorder import Event
from opgraph.ir.ops import OpKind

_FN = {
    "copy_": "copy",
    "copy": "copy",
    "clone": "copy",
    "contiguous": "copy",
    "_to_copy": "cast",
    "cat": "cat",
    "stack": "cat",
    "index": "index",
    "index_select": "index",
    "gather": "index",
    "take": "index",
    "masked_select": "index",
    "index_put": "index_put",
    "index_put_": "index_put",
    "_index_put_impl_": "index_put",
    "index_copy": "index_put",
    "index_copy_": "index_put",
    "scatter": "scatter",
    "scatter_": "scatter",
    "scatter_reduce": "scatter",
    "slice_scatter": "scatter",
    "select_scatter": "scatter",
    "diagonal_scatter": "scatter",
    "as_strided_scatter": "scatter",
    "fill": "fill",
    "fill_": "fill",
    "zero_": "fill",
    "zeros": "fill",
    "zeros_like": "fill",
    "ones": "fill",
    "ones_like": "fill",
    "full": "fill",
    "full_like": "fill",
    "new_zeros": "fill",
    "new_ones": "fill",
    "new_full": "fill",
    "arange": "fill",
    "scalar_tensor": "fill",
    "tril": "mask",
    "triu": "mask",
    "repeat": "copy",
    "repeat_interleave": "copy",
    "expand_copy": "copy",
    "constant_pad_nd": "copy",
    "flip": "copy",
    "roll": "copy",
    "one_hot": "fill",
    "linspace": "fill",
    "randn": "fill",
    "rand": "fill",
    "randint": "fill",
    "normal_": "fill",
    "uniform_": "fill",
    "bernoulli_": "fill",
    "nonzero": "index",
    "unique": "index",
    "_unique2": "index",
    "unbind": "copy",
    "split_with_sizes_copy": "copy",
}


def memory_fn(ev: Event) -> str | None:
    """The :class:`~opgraph.ir.Memory` function an event is (``cast``, ``copy``, ``cat``...), or ``None``
    for one that moves no data this way; a cast to the same dtype is a ``copy``."""
    fn = _FN.get(ev.fn)
    if fn == "cast" and ev.inputs and ev.outputs and ev.inputs[0].dtype == ev.outputs[0].dtype:
        return "copy"
    return fn


@dataclass(frozen=True)
class LowerMemory:
    """``Memory`` ops for data movement without arithmetic."""

    name: ClassVar[str] = "memory"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            fn = memory_fn(ev)
            if fn is None:
                continue
            n = sum(numel(o) for o in ev.outputs)
            lw.claim([ev.index], OpKind.MEMORY, {"fn": fn, "numel": n})
