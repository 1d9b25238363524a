"""The held-out report on MoE models: a capture under another transformers release than the measured one is
noted (the per-expert attribution of torch's ``_grouped_mm`` fallback is ``opgraph compare``'s now:
tests/opgraph/compare/test_compare_attribution.py)."""

from __future__ import annotations

from tests.simulators.test_heldout_results import report_mod


def test_a_transformers_version_other_than_the_measured_one_is_noted() -> None:
    # The MoE experts code differs between versions (5.17 masks sentinel rows around every grouped GEMM).
    note = report_mod.library_mismatch("5.17.0", "5.24.0")
    assert note is not None and "5.17.0" in note and "5.24.0" in note
    assert report_mod.library_mismatch("5.24.0", "5.24.0") is None
