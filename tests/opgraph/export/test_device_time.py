"""Device time is kernel and device memcpy/memset time only, in every report, comparison and export.

The real-trace tests sum the device events of the raw profiler JSON themselves (not through the
importer) and check every consumer against that number.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from opgraph.compare import compare_timelines, device_spans
from opgraph.export import trace_document, write_perfetto
from opgraph.export.stats import comparison_tables, summarize
from opgraph.ir import OpKind, Span, Timeline, TimelineKind, TimelineSource
from opgraph.ir.timeline import Bound, SpanCategory
from opgraph.trace import KernelType, load_trace

TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces").resolve()
REAL = (
    "hf-llama-1b-like-h200-prefill512-decode8.json.gz",
    "TraceLens__vllm_decode_full__graph_execution.json.gz",
    "TraceLens__sglang_Qwen3-8B_decode.json.gz",
    "TraceLens__h100_Qwen1.5-0.5B-Chat.json.gz",
)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Kineto's ``cat`` of device work."""


def _path(name: str) -> Path:
    p = TRACES / name
    if not p.exists():
        pytest.skip(f"real trace {name} not found in {TRACES} (shared data lives beside the repo)")
    return p


@cache
def _raw_device(name: str) -> tuple[int, float, int]:
    """(device events, their summed duration, host events) read straight from the raw trace JSON."""
    with gzip.open(_path(name), "rt") as f:
        events = json.load(f)["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation")]
    return len(device), sum(float(e["dur"]) for e in device), len(host)


@cache
def _timeline(name: str) -> Timeline:
    return load_trace(_path(name))


def _span(category: str | None, track: str, start: float, dur: float, **kw: Any) -> Span:
    return Span(name=f"{category}", track=track, start_us=start, dur_us=dur, category=category, **kw)


def _mixed() -> Timeline:
    """A measured timeline with every kind of host span around 10 us of kernels and 2 us of memcpy."""
    spans = (
        _span("gemm", "gpu0/stream7", 10, 6),
        _span("norm", "gpu0/stream7", 16, 4),
        _span("memcpy", "gpu0/stream7", 20, 2),
        _span("cpu_op", "cpu/1", 0, 30),
        _span("runtime", "cpu/1", 1, 3),
        _span("annotation", "cpu/1", 0, 40),
        _span("gpu_annotation", "gpu0/annotations", 9, 20),
        _span("python", "cpu/1", 0, 35),
    )
    return Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="m"), spans=spans)


# --- the typed category ------------------------------------------------------------------------


def test_kineto_and_legacy_category_names_load_as_their_category() -> None:
    cases = {
        "cuda_runtime": SpanCategory.RUNTIME,
        "cuda_driver": SpanCategory.RUNTIME,
        "user_annotation": SpanCategory.ANNOTATION,
        "gpu_user_annotation": SpanCategory.GPU_ANNOTATION,
        "python_function": SpanCategory.PYTHON,
        "gpu_memcpy": SpanCategory.MEMCPY,
        "Kernel": SpanCategory.KERNEL,
        "gemm": SpanCategory.GEMM,
    }
    for text, category in cases.items():
        doc = _span(None, "t", 0, 1).model_dump(mode="json") | {"category": text}
        assert Span.model_validate_json(json.dumps(doc)).category is category, text


def test_a_misspelt_category_or_bound_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="category"):
        _span("kernal", "t", 0, 1)
    with pytest.raises(ValidationError, match="bound"):
        _span(None, "t", 0, 1, bound="compte")


def test_category_and_bound_keep_their_saved_strings() -> None:
    span = _span("runtime", "cpu/1", 0, 1, bound="host")
    assert span.bound is Bound.HOST
    doc = json.loads(span.model_dump_json())
    assert (doc["category"], doc["bound"]) == ("runtime", "host")


def test_every_kernel_type_and_op_kind_is_a_device_category() -> None:
    # The importer saves a kernel's type and simulated timelines may save the op kind as the category.
    values = {c.value: c for c in SpanCategory}
    for name in [k.value for k in KernelType] + [k.value for k in OpKind]:
        assert name in values and values[name].is_device, name


def test_only_device_work_is_on_device() -> None:
    host = {c for c in SpanCategory if not c.is_device}
    assert host == {
        SpanCategory.HOST,
        SpanCategory.CPU_OP,
        SpanCategory.RUNTIME,
        SpanCategory.ANNOTATION,
        SpanCategory.GPU_ANNOTATION,
        SpanCategory.PYTHON,
    }
    assert _span(None, "engine0", 0, 1).on_device  # a simulated op


# --- every consumer on a small timeline ----------------------------------------------------------


def test_reports_comparisons_and_exports_count_kernels_and_copies_only() -> None:
    tl = _mixed()
    assert summarize(tl).device_time_us == 12
    assert sum(s.dur_us for s in device_spans(tl)) == 12
    by_kind = {r.key: r.total_us for r in summarize(tl).by_kind}
    assert by_kind == {"gemm": 6, "norm": 4, "memcpy": 2}
    (end, *_) = comparison_tables(tl, tl)
    assert dict((r[0], r[1]) for r in end.rows)["device time"] == "12.00 us"
    assert compare_timelines(tl, tl).row("gpu_time").reference_us == 12
    cats = {e["name"]: e["cat"] for e in trace_document([tl], counter_bins=0)["traceEvents"] if e["ph"] == "X"}
    assert cats == {
        "gemm": "kernel",
        "norm": "kernel",
        "memcpy": "gpu_memcpy",
        "cpu_op": "cpu_op",
        "runtime": "cuda_runtime",
        "annotation": "user_annotation",
        "gpu_annotation": "gpu_user_annotation",
        "python": "python_function",
    }


# --- real traces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REAL)
def test_device_time_of_real_traces_is_their_kernel_and_copy_time(name: str) -> None:
    n_raw, raw_us, n_host = _raw_device(name)
    tl = _timeline(name)
    assert n_host and len(tl.spans) > n_raw  # the timeline holds host spans that must not count
    summary = summarize(tl)
    assert summary.device_spans == n_raw
    assert summary.device_time_us == pytest.approx(raw_us, rel=1e-9)
    assert sum(r.total_us for r in summary.by_kind) == pytest.approx(raw_us, rel=1e-9)
    assert sum(r.total_us for r in summary.by_layer) == pytest.approx(raw_us, rel=1e-9)
    assert compare_timelines(tl, tl).row("gpu_time").reference_us == pytest.approx(raw_us, rel=1e-9)


@pytest.mark.parametrize("name", REAL[:2])
def test_perfetto_export_of_real_traces_marks_only_device_work_as_device(name: str, tmp_path: Path) -> None:
    n_raw, raw_us, _ = _raw_device(name)
    out = write_perfetto([_timeline(name)], tmp_path / "t.json", counter_bins=0)
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    device = [e for e in events if e["cat"] in DEVICE_CATS]
    assert len(device) == n_raw
    # rounding to whole nanoseconds moves each duration by at most 1 ns
    assert sum(e["dur"] for e in device) == pytest.approx(raw_us, abs=1e-3 * n_raw)
    assert not any(e["name"].startswith(("cuda", "hip")) and "Kernel" not in e["name"] for e in device)


def test_hta_sees_only_the_kernels_of_an_exported_trace_as_gpu_work(tmp_path: Path) -> None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:
        pytest.skip(f"HolisticTraceAnalysis cannot be imported: {exc}")
    name = "TraceLens__vllm_decode_full__graph_execution.json.gz"
    n_raw, raw_us, _ = _raw_device(name)
    write_perfetto([_timeline(name)], tmp_path / "rank0.json", counter_bins=0)
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    df = analysis.t.get_trace(0)
    gpu = df[df["stream"] >= 0]  # HTA puts CPU events on stream -1
    assert len(gpu) == n_raw
    # HTA rounds times to whole microseconds
    assert float(gpu["dur"].sum()) == pytest.approx(raw_us, abs=n_raw)
