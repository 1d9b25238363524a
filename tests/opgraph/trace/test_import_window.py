"""An imported timeline marks and notes the device events that ran work launched before the profiler
window opened, the events ``opgraph analyze`` and ``opgraph compare`` set apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.compare.measured import MeasuredRank
from opgraph.ir import Span, Timeline, load_timeline
from opgraph.trace import analyze, attribute_kernels, load_trace
from tests.conftest import TRACES
from tests.opgraph.trace.test_classify import GEMM, _Builder, _ev, _layer

MARK = "launched_before_window"
"""The span arg that marks them."""


def _leftover_trace(tmp_path: Path) -> Path:
    """Two kernels and a memset with no launch in the trace, a layer, then a later kernel without one (a
    kernel of the trace's own time whose launch was lost: no leftover)."""
    b = _Builder()
    for i in range(2):
        b.events.append(_ev("kernel", GEMM, 100.0 + 10 * i, 5.0, device=0, stream=7))
    b.events.append(_ev("gpu_memset", "Memset (Device)", 120.0, 1.0, device=0, stream=7))
    _layer(b, "flash_fwd_kernel")
    b.events.append(_ev("kernel", GEMM, b.t + 50, 5.0, device=0, stream=7))
    return b.write(tmp_path)


def _device(tl: Timeline) -> list[Span]:
    return [s for s in tl.spans if s.on_device]


def test_imported_spans_of_work_launched_before_the_window_are_marked_and_noted(tmp_path: Path) -> None:
    path = _leftover_trace(tmp_path)
    tl = load_trace(path)
    device = _device(tl)
    marked = [s for s in device if s.args.get(MARK) is True]
    assert [(s.name, s.start_us) for s in marked] == [(s.name, s.start_us) for s in device[:3]]
    assert len(marked) == analyze(path).window_events == 3
    assert all(MARK not in s.args for s in tl.spans if s not in marked)  # the late unlinked kernel is not one
    # in no pass, layer or stage, with no launch
    assert all((s.step, s.layer, s.stage) == (None, None, None) and "launch" not in s.args for s in marked)
    (note,) = [n for n in tl.notes if "before the profiler window" in n]
    assert note.startswith("3 device events (2 kernels, 0.011 ms) at the start ran work launched before")
    assert f"{MARK}=true" in note
    # analysed again, the timeline gives the same events, noted once (in the analysis's words)
    r = analyze(tl)
    assert (r.window_events, r.window_time_us) == (3, 11.0)
    (again,) = [n for n in r.notes if "before the profiler window" in n]
    assert "left out of every total and table" in again


@pytest.mark.parametrize("kernels_only", [False, True])
def test_cli_import_says_so(tmp_path: Path, kernels_only: bool) -> None:
    path = _leftover_trace(tmp_path)
    out = tmp_path / "tl.json"
    res = CliRunner().invoke(app, ["import", str(path), "-o", str(out), *(["--kernels-only"] if kernels_only else [])])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if "before the profiler window" in x]
    assert line.startswith("note: 3 device events")
    tl = load_timeline(out)
    assert [s.args.get(MARK) for s in _device(tl)][:4] == [True, True, True, None]


def test_real_trace_marks_the_events_analyze_attribution_and_compare_leave_out() -> None:
    # the TraceLens H100 Qwen1.5 trace: the window opens inside a step; its first 509 device events ran
    # the earlier step's work
    path = TRACES / "TraceLens__h100_Qwen1.5-0.5B-Chat.json.gz"
    if not path.exists():
        pytest.skip(f"real trace {path.name} not found in {TRACES} (shared data lives beside the repo)")
    tl = load_trace(path)
    device = _device(tl)
    marked = [s for s in device if s.args.get(MARK) is True]
    assert len(marked) == 509
    assert marked == device[:509]
    assert analyze(path).window_events == attribute_kernels(path).unattributed_events == 509
    assert MeasuredRank.of(tl).skip == 509  # what `opgraph compare` leaves out
    (note,) = [n for n in tl.notes if "before the profiler window" in n]
    assert note.startswith("509 device events (436 kernels,")
