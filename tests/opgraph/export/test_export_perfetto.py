"""Perfetto/Chrome trace export: structure (golden), ordering, args, flows, counters, streaming, HTA, round trip."""

from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path
from typing import Any

import ijson
import pytest
from conftest import check_golden
from export_fixtures import graph, measured, plain, simulated
from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.export import ExportError, trace_document, trace_time, write_perfetto
from opgraph.export.perfetto import assign_tids, busy_fractions, trace_span_times, write_events
from opgraph.ir import Span, Timeline, TimelineKind, TimelineSource


def _structure(doc: dict[str, Any]) -> dict[str, Any]:
    """What users depend on, without timestamps: header keys, metadata, and each event's shape and arg keys."""
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    timelines = [{**t, "wall_us": t["wall_us"] is not None} for t in header["opgraph"]["timelines"]]
    header["opgraph"] = {**header["opgraph"], "version": "<version>", "timelines": timelines}
    events = []
    for ev in doc["traceEvents"]:
        if ev["ph"] == "M":
            events.append(ev)
        elif ev["ph"] == "X":
            events.append(
                {k: v for k, v in ev.items() if k not in ("ts", "dur", "args")} | {"args": sorted(ev["args"])}
            )
        elif ev["ph"] == "C":
            events.append({"ph": "C", "name": ev["name"], "pid": ev["pid"], "args": sorted(ev["args"])})
        else:
            events.append({k: v for k, v in ev.items() if k not in ("ts", "id")})
    # Counters are many identical samples: keep the first of each process.
    seen: set[int] = set()
    kept = []
    for ev in events:
        if ev["ph"] == "C":
            if ev["pid"] in seen:
                continue
            seen.add(ev["pid"])
        kept.append(ev)
    return {"header": header, "events": kept}


def test_golden_structure_simulated_and_measured() -> None:
    g = graph(layers=1)
    doc = trace_document([simulated(g), measured(g)], graph=g, flows=True, counter_bins=4)
    structure = _structure(doc)
    # One event per line keeps the golden file short and its diffs readable.
    lines = [json.dumps(structure["header"], sort_keys=True)] + [
        json.dumps(e, sort_keys=True) for e in structure["events"]
    ]
    check_golden("export/perfetto_structure.jsonl", "\n".join(lines) + "\n")


def test_processes_threads_and_kineto_fields() -> None:
    g = graph()
    sim, meas = simulated(g), measured(g)
    doc = trace_document([sim, meas], graph=g)
    ev = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {
        (0, "simulated: demo-llama roofline on H100-SXM"),
        (1, "measured: demo-llama measured on H100-SXM"),
    }
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(1, 7)] == "stream 7"  # a stream keeps its number as tid
    assert sorted(v for (pid, _), v in threads.items() if pid == 0) == ["engine0", "engine1", "host"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(sim.spans) + len(meas.spans)
    kernels = [e for e in xs if e["cat"] == "kernel"]
    host = [e for e in xs if e["cat"] == "cpu_op"]
    assert len(host) == sum(1 for s in sim.spans if s.category == "host")
    assert all("stream" not in e["args"] for e in host)
    assert all(e["args"]["stream"] == e["tid"] and e["args"]["device"] == e["pid"] for e in kernels)
    assert len({e["args"]["correlation"] for e in kernels}) == len(kernels)
    assert doc["deviceProperties"] == [{"id": 0, "name": "H100-SXM"}, {"id": 1, "name": "H100-SXM"}]
    assert doc["distributedInfo"]["rank"] == 0


def test_args_carry_op_details_from_the_graph() -> None:
    g = graph()
    sim = simulated(g)
    doc = trace_document([sim], graph=g)
    by_op = {e["args"]["op_id"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"}
    attn = next(o for o in g.ops if o.kind.value == "attention")
    args = by_op[attn.id]["args"]
    assert args["kind"] == "attention"
    assert args["definition"] == attn.definition
    assert args["flops"] == attn.flops
    assert args["bytes_read"] == attn.bytes_read and args["bytes_written"] == attn.bytes_written
    assert args["layer"] == attn.layer and args["stage"] == "prefill" and args["dtype"] == "bf16"
    (engine_span,) = [s for s in sim.spans if s.op_id == attn.id and s.on_device]
    assert engine_span.bound is not None and args["bound"] == engine_span.bound.value
    assert args["scope"] == attn.scope
    # Without the graph, only what the span itself knows.
    bare = trace_document([sim])
    bare_args = next(e["args"] for e in bare["traceEvents"] if e["ph"] == "X" and e["args"].get("op_id") == attn.id)
    assert "flops" not in bare_args and bare_args["kind"] == "attention"


def test_shapes_in_kineto_arg_names() -> None:
    from opgraph.ir import DType, Gemm, OpGraph, TensorSpec

    op = Gemm(
        id=0, m=4, n=8, k=16,
        inputs=(TensorSpec(shape=(4, 16), dtype=DType.bf16), TensorSpec(shape=(16, 8), dtype=DType.bf16)),
        outputs=(TensorSpec(shape=(4, 8), dtype=DType.fp32),),
    )  # fmt: skip
    g = OpGraph(ops=(op,))
    tl = Timeline(
        source=TimelineSource(kind=TimelineKind.SIMULATED),
        spans=(Span(name="mm", track="e0", start_us=0, dur_us=1, op_id=0),),
    )
    args = next(e["args"] for e in trace_document([tl], graph=g)["traceEvents"] if e["ph"] == "X")
    assert args["Input Dims"] == [[4, 16], [16, 8]]
    assert args["Input type"] == ["bf16", "bf16"]
    assert args["Output Dims"] == [[4, 8]]


def test_events_after_metadata_are_sorted_and_times_match_spans() -> None:
    g = graph()
    sim, meas = simulated(g), measured(g)
    ev = trace_document([sim, meas], graph=g, flows=True)["traceEvents"]
    first_data = next(i for i, e in enumerate(ev) if e["ph"] != "M")
    assert all(e["ph"] == "M" for e in ev[:first_data]) and all(e["ph"] != "M" for e in ev[first_data:])
    ts = [e["ts"] for e in ev[first_data:]]
    assert ts == sorted(ts)
    got = sorted((e["pid"], e["ts"], e["dur"], e["name"]) for e in ev if e["ph"] == "X")
    want = sorted((pid, s.start_us, s.dur_us, s.name) for pid, tl in enumerate((sim, meas)) for s in tl.spans)
    assert got == want


def test_flows_join_device_spans_of_data_edges() -> None:
    g = graph(layers=1)
    sim = simulated(g)
    ev = trace_document([sim], graph=g, flows=True)["traceEvents"]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    data_pairs = {(e.src, e.dst) for e in g.edges}
    assert len(starts) == len(data_pairs)
    host_tid = next(
        e["tid"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == "host"
    )
    assert all(e["tid"] != host_tid for e in [*starts.values(), *ends.values()])
    for fid, s in starts.items():
        assert s["bp"] == "e" and ends[fid]["bp"] == "e" and s["ts"] <= ends[fid]["ts"]
    # Off by default, and refused without the graph.
    assert not any(e["ph"] in "sf" for e in trace_document([sim], graph=g)["traceEvents"])
    with pytest.raises(ExportError, match="graph"):
        trace_document([sim], flows=True)


def test_utilisation_counters() -> None:
    tl = plain([("a", "e0", 0, 50), ("b", "e0", 50, 50), ("c", "e1", 0, 25)])
    cs = [e for e in trace_document([tl], counter_bins=4)["traceEvents"] if e["ph"] == "C"]
    assert [c["ts"] for c in cs] == [0, 25, 50, 75, 100]
    assert [c["args"]["e0"] for c in cs] == [100, 100, 100, 100, 0]
    assert [c["args"]["e1"] for c in cs] == [100, 0, 0, 0, 0]
    assert not any(e["ph"] == "C" for e in trace_document([tl], counter_bins=0)["traceEvents"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 30, allow_nan=False)), max_size=12),
    st.integers(1, 9),
)
def test_busy_fractions_match_brute_force(ivs: list[tuple[float, float]], bins: int) -> None:
    import numpy as np

    starts = np.array([s for s, _ in ivs])
    ends = np.array([s + d for s, d in ivs])
    edges = np.linspace(0, 130, bins + 1)
    got = busy_fractions(starts, ends, edges)
    # Brute force: union of intervals intersected with each bin.
    merged: list[list[float]] = []
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    for i in range(bins):
        lo, hi = edges[i], edges[i + 1]
        want = sum(max(0.0, min(hi, e) - max(lo, s)) for s, e in merged) / (hi - lo)
        assert got[i] == pytest.approx(want, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.floats(0, 1e7, allow_nan=False), st.floats(0, 1e4, allow_nan=False))
def test_trace_times_are_nanosecond_rounded_and_keep_adjacency(start: float, dur: float) -> None:
    ts, d = trace_span_times(start, dur)
    assert ts == trace_time(start) and abs(ts - start) <= 5e-4 + 1e-9
    nxt, _ = trace_span_times(start + dur, 1.0)
    assert abs(ts + d - nxt) < 1e-6  # the next span starts where this one ends


def test_assign_tids() -> None:
    assert assign_tids(["stream 7", "host", "stream 13", "CUDA stream 1", "engine0"]) == {
        "stream 7": 7, "stream 13": 13, "CUDA stream 1": 1, "host": 2, "engine0": 3,
    }  # fmt: skip
    assert assign_tids(["stream 3", "stream3"]) == {"stream 3": 3, "stream3": 1}
    assert assign_tids(["cpu/413", "gpu0/stream7", "rank1/gpu1/stream7"]) == {
        "gpu0/stream7": 7, "cpu/413": 1, "rank1/gpu1/stream7": 2,
    }  # fmt: skip


def test_write_json_and_gz_atomically(tmp_path: Path) -> None:
    g = graph()
    tl = simulated(g)
    p = write_perfetto([tl], tmp_path / "t.json", graph=g)
    doc = json.loads(p.read_text())
    pz = write_perfetto([tl], tmp_path / "t.json.gz", graph=g)
    assert json.loads(gzip.decompress(pz.read_bytes())) == doc
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json", "t.json.gz"]
    # A failure half-way leaves the earlier file as it was and no temporary file.
    bad = Timeline(source=tl.source, spans=(*tl.spans, Span(name="x", track="e9", start_us=1e9, dur_us=math.inf)))
    with pytest.raises(ExportError, match="non-finite duration"):
        write_perfetto([bad], p)
    assert json.loads(p.read_text()) == doc
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json", "t.json.gz"]


def test_user_errors(tmp_path: Path) -> None:
    tl = plain([("a", "e0", 0, 1)])
    with pytest.raises(ExportError, match=r"\.json or \.json\.gz"):
        write_perfetto([tl], tmp_path / "t.txt")
    with pytest.raises(ExportError, match="at least one timeline"):
        write_perfetto([], tmp_path / "t.json")
    with pytest.raises(ExportError, match="not a Timeline"):
        write_perfetto(["nope"], tmp_path / "t.json")  # type: ignore[list-item]


def test_nonfinite_args_become_strings() -> None:
    tl = Timeline(
        source=TimelineSource(kind=TimelineKind.MEASURED),
        spans=(Span(name="k", track="stream 7", start_us=0, dur_us=1, args={"ratio": math.nan, "grid": "[1,1,1]"}),),
    )
    args = next(e["args"] for e in trace_document([tl])["traceEvents"] if e["ph"] == "X")
    assert args["ratio"] == "nan" and args["grid"] == "[1,1,1]"


def test_streaming_writer_is_valid_json_across_flushes(tmp_path: Path) -> None:
    import opgraph.export.perfetto as perfetto

    n = 3000
    spans = tuple(Span(name=f"k{i % 7}", track=f"stream {i % 3}", start_us=float(i), dur_us=0.5) for i in range(n))
    tl = Timeline(source=TimelineSource(kind=TimelineKind.SIMULATED, name="big"), spans=spans)
    old = perfetto.BATCH_EVENTS
    perfetto.BATCH_EVENTS = 7  # many batches, one ending exactly at the last event
    try:
        p = write_perfetto([tl], tmp_path / "big.json.gz", counter_bins=10)
    finally:
        perfetto.BATCH_EVENTS = old
    with gzip.open(p, "rb") as f:
        count = sum(1 for e in ijson.items(f, "traceEvents.item") if e["ph"] == "X")
    assert count == n


def test_write_events_counts(tmp_path: Path) -> None:
    import io

    buf = io.BytesIO()
    assert write_events(buf, {"a": 1}, iter([{"x": 1}, {"x": 2}])) == 2
    assert json.loads(buf.getvalue()) == {"a": 1, "traceEvents": [{"x": 1}, {"x": 2}]}
    buf = io.BytesIO()
    assert write_events(buf, {}, iter([])) == 0
    assert json.loads(buf.getvalue()) == {"traceEvents": []}


@pytest.mark.filterwarnings("ignore")
def test_holistic_trace_analysis_reads_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("hta", reason="holistictraceanalysis is not installed")
    from hta.trace_analysis import TraceAnalysis

    g = graph()
    tl = simulated(g)
    write_perfetto([tl], tmp_path / "rank0.json.gz", graph=g)
    with caplog.at_level(logging.ERROR):
        analysis = TraceAnalysis(trace_dir=str(tmp_path))
    df = analysis.t.get_trace(0)
    kernels = df[df["stream"] >= 0]
    device = [s for s in tl.spans if s.category != "host"]
    assert len(kernels) == len(device)
    assert kernels["dur"].sum() == pytest.approx(sum(s.dur_us for s in device))
    assert (df["stream"] == -1).sum() == len(tl.spans) - len(device)  # host spans are CPU ops
    sym = analysis.t.symbol_table.get_sym_table()
    assert {sym[i] for i in kernels["name"]} == {s.name for s in device}


def test_round_trip_through_our_importer(tmp_path: Path) -> None:
    trace = pytest.importorskip(
        "opgraph.trace", reason="the trace importer (opgraph.trace.load_trace) is not there yet"
    )
    if not hasattr(trace, "load_trace"):
        pytest.skip("opgraph.trace has no load_trace yet")
    g = graph()
    sim = simulated(g)
    p = write_perfetto([sim], tmp_path / "sim.json.gz", graph=g)
    back = trace.load_trace(p)
    device = [s for s in sim.spans if s.category != "host"]
    kernels = [s for s in back.spans if s.category not in ("host", "cpu_op")]
    assert len(kernels) == len(device)
    assert sum(s.dur_us for s in kernels) == pytest.approx(sum(s.dur_us for s in device), rel=1e-6)
    assert sorted(s.name for s in kernels) == sorted(s.name for s in device)
    # One stream per engine, with the engine's spans.
    per_track = sorted(sum(1 for s in kernels if s.track == t) for t in {s.track for s in kernels})
    assert per_track == sorted(sum(1 for s in device if s.track == t) for t in {s.track for s in device})
    # Op attribution survives the round trip, so an exported trace can be compared by op id again.
    key = lambda s: (s.op_id, s.definition, s.layer, s.stage)  # noqa: E731
    assert sorted(map(key, kernels), key=str) == sorted(map(key, device), key=str)
    from opgraph.compare import compare_timelines

    assert compare_timelines(sim, back).matched == len({s.op_id for s in device})
