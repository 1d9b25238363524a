"""A host profile built on this machine from two tiny graphs captured with --host-timing, then used
for a graph captured without it (CPU only, no timing asserted: only where each number comes from)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from hardware.hostfit import main
from hardware.hostprofile import graph_keys, load_host_profile, predict_gaps
from opgraph.capture.api import capture
from opgraph.ir import save_graph


@pytest.mark.slow
def test_profile_from_two_captures_predicts_an_untimed_capture(tiny_config: str, tmp_path: Path) -> None:
    decode = capture(tiny_config, phase="decode", batch=2, kv_len=16, host_timing=True)
    prefill = capture(tiny_config, phase="prefill", batch=1, seq_len=8, host_timing=True)
    files = [save_graph(g, tmp_path / f"{g.metadata.phase}.json") for g in (decode, prefill)]
    out = tmp_path / "cpu.host.json"
    assert main([*map(str, files), "-o", str(out)]) == 0
    prof = load_host_profile(out)
    assert decode.metadata.host_timing is not None
    assert prof.host.cpu == decode.metadata.host_timing.cpu
    assert [t.phase for t in prof.training] == ["decode", "prefill"]

    # Another shape of the same model, never timed: every op is found under its exact key, and its
    # gap is the median of the training ops with that key.
    target = capture(tiny_config, phase="decode", batch=4, kv_len=32)
    assert all(op.host_gap_us is None for op in target.ops)
    pred = predict_gaps(target, prof)
    assert pred.levels == {"exact": len(target.ops)}
    samples: dict[str, list[float]] = {}
    for g in (decode, prefill):
        for op, keys in zip(g.ops, graph_keys(g), strict=True):
            samples.setdefault(keys[0], []).append(op.host_gap_us or 0.0)
    expected = [round(statistics.median(samples[k[0]]), 3) for k in graph_keys(target)]
    assert pred.gaps_us == expected
