"""``fold-views``: views, reshapes, metadata ops and bare allocations launch no kernel; fold them away.

Their outputs share their input's tensor id (see the recorder), so data edges run from the real
producer to the real consumers and no dependency is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering

FREE_FNS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "lift_fresh",
        "lift_fresh_copy",
        "detach",
        "alias",
        "_unsafe_view",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "is_same_size",
        "_local_scalar_dense",
        "resolve_conj",
        "resolve_neg",
        "set_",
        "record_stream",
        "_assert_async",
        "_assert_tensor_metadata",
        "_functional_assert_async",
    }
)


@dataclass(frozen=True)
class FoldViews:
    """Fold view, metadata and allocation events."""

    name: ClassVar[str] = "fold-views"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if ev.alias or ev.fn in FREE_FNS:
                lw.fold(ev.index)
