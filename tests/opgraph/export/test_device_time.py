"""Device time is kernel and device memcpy/memset time only, in every report, comparison and export.

Here on hand-made timelines; tests/opgraph/trace/test_trace_real.py checks real traces against
the device time summed from their raw JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from opgraph.compare import compare_timelines, device_spans
from opgraph.export import trace_document
from opgraph.export.stats import comparison_tables, summarize
from opgraph.ir import OpKind, Span, Timeline, TimelineKind, TimelineSource
from opgraph.ir.timeline import Bound, SpanCategory
from opgraph.trace import KernelType, load_trace


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


KINETO_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Kineto's ``cat`` of device work; every other ``cat`` is host activity or a marker."""


def test_only_kinetos_device_events_import_as_device_work(tmp_path: Path) -> None:
    cats = (*KINETO_DEVICE_CATS, "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "gpu_user_annotation")
    events = [
        {"ph": "X", "cat": cat, "name": cat, "pid": 0, "tid": 1, "ts": 10.0 * i, "dur": 5.0, "args": {"stream": 7}}
        for i, cat in enumerate(cats)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tl = load_trace(path)
    assert {s.name: s.on_device for s in tl.spans} == {cat: cat in KINETO_DEVICE_CATS for cat in cats}
    assert _span(None, "engine0", 0, 1).on_device  # a simulated op on an engine


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


def test_simulated_issue_on_the_host_is_no_device_time() -> None:
    # The simulator builds spans without validation, so they hold plain strings: the rule must hold for them too.
    from opgraph.ir import Edge, Elementwise, OpGraph
    from simulators import HostConfig, SchedulingProblem, SimulationConfig, run_problem

    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(3))
    graph = OpGraph(ops=ops, edges=(Edge(src=0, dst=2), Edge(src=1, dst=2)))
    problem = SchedulingProblem.from_durations(graph, {0: 4.0, 1: 4.0, 2: 1.0})
    tl = run_problem(problem, SimulationConfig.standard(engines=2, host=HostConfig(per_op_us=3.0))).timeline()
    assert len(tl.spans) == 6
    assert summarize(tl).device_time_us == 9
    cats = sorted(e["cat"] for e in trace_document([tl], counter_bins=0)["traceEvents"] if e["ph"] == "X")
    assert cats == ["cpu_op"] * 3 + ["kernel"] * 3
    again = Timeline.model_validate_json(tl.model_dump_json())
    assert {(s.category, s.bound) for s in again.spans if not s.on_device} == {(SpanCategory.HOST, Bound.HOST)}
