"""Per-op attribution of the held-out report for MoE experts: torch's fallback of ``_grouped_mm``
launches one ``mm`` per expert inside ONE top-level call; each kernel goes to the recorded call that
launched it, not all of them to the first recorded call of the top-level call."""

from __future__ import annotations

from typing import Any

from tests.simulators.test_heldout_results import report_mod


def _node(name: str, start: float, end: float, *children: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "start": start, "end": end, "children": list(children)}


def test_kernels_of_a_fallback_grouped_mm_go_to_the_mm_that_launched_each() -> None:
    grouped = _node(
        "aten::_grouped_mm",
        0.0,
        10.0,
        _node("aten::empty_strided", 0.0, 0.5),
        _node("aten::to", 1.0, 2.0, _node("aten::_to_copy", 1.1, 1.9)),
        _node("aten::mm", 3.0, 4.0),
        _node("aten::mm", 5.0, 6.0),
    )
    names = ["aten::empty_strided", "aten::_to_copy", "aten::mm", "aten::mm"]
    ops = [None, 7, 8, 9]
    owners, found, missing = report_mod.owners_of_calls([grouped], names, ops)
    assert (owners, found, missing) == ([7], 4, 0)  # the call's owner: its first op (the offsets copy)
    assert report_mod.launched_by(grouped, 1.5) == 7
    assert report_mod.launched_by(grouped, 3.5) == 8
    assert report_mod.launched_by(grouped, 5.5) == 9
    assert report_mod.launched_by(grouped, 8.0) is None  # no recorded call running: the caller decides


def test_sequence_matching_marks_the_calls_it_pairs() -> None:
    # A trace with calls of another transformers version in between (masked_fill) still gives each
    # per-expert kernel to its own mm.
    calls = [
        _node("aten::masked_fill", 0.0, 1.0),
        _node("aten::_grouped_mm", 2.0, 9.0, _node("aten::mm", 3.0, 4.0), _node("aten::mm", 5.0, 6.0)),
    ]
    names = ["aten::cos", "aten::mm", "aten::mm"]
    owners, found, missing = report_mod.owners_by_diff(calls, names, [1, 2, 3])
    assert (owners, found, missing) == ([None, 2], 2, 1)
    assert report_mod.launched_by(calls[1], 5.5) == 3


def test_a_transformers_version_other_than_the_measured_one_is_noted() -> None:
    # The MoE experts code differs between versions (5.17 masks sentinel rows around every grouped GEMM).
    note = report_mod.library_mismatch("5.17.0", "5.24.0")
    assert note is not None and "5.17.0" in note and "5.24.0" in note
    assert report_mod.library_mismatch("5.24.0", "5.24.0") is None
