"""Trace import on synthetic files: quirks, links, bad input, the streaming parser, user patterns."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import LoadError
from opgraph.trace import (
    NoTraceEventsError,
    PatternError,
    TraceFormatError,
    analyze,
    load_patterns,
    load_trace,
    load_trace_data,
    read_trace,
)


def _kernel(name: str, ts: float, dur: float, corr: int, ext: int, *, cat: str = "kernel") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": {
            "External id": ext,
            "device": 0,
            "stream": 7,
            "correlation": corr,
            "grid": [4, 1, 1],
            "block": [128, 1, 1],
        },
    }


def _launch(ts: float, corr: int, ext: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 2.0,
        "args": {"External id": ext, "correlation": corr},
    }


def _op(name: str, ts: float, dur: float, ext: int, dims: list[Any] | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"External id": ext}
    if dims is not None:
        args["Input Dims"] = dims
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _layer_events(t0: float, corr0: int, q_len: int) -> list[dict[str, Any]]:
    """One pre-norm block: norm, qkv gemm, attention (launched by SDPA with q_len), o gemm, norm, MLP."""
    names = [
        ("void rms_norm_kernel<bf16>", None),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", None),
        ("flash_fwd_kernel_bf16", [[1, 32, q_len, 64], [1, 8, 64, 64], [1, 8, 64, 64]]),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", None),
        ("void rms_norm_kernel<bf16>", None),
        ("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", None),
        ("void silu_and_mul_kernel<bf16>", None),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", None),
    ]
    out = []
    for i, (name, dims) in enumerate(names):
        ts = t0 + 10 * i
        corr = corr0 + i
        op = (
            "aten::scaled_dot_product_attention"
            if dims
            else ("_C::rms_norm" if "norm" in name else ("_C::silu_and_mul" if "silu" in name else "aten::mm"))
        )
        out += [_op(op, ts, 5, corr, dims), _launch(ts + 1, corr, corr), _kernel(name, ts + 4, 3, corr, corr)]
    return out


def _trace(layers: int = 2, passes: int = 2, **meta: Any) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    t, corr = 1000.0, 1
    for p in range(passes):
        for _ in range(layers):
            events += _layer_events(t, corr, 512 if p == 0 else 1)
            t += 100
            corr += 10
        events += [
            _op("aten::argmax", t, 5, corr),
            _launch(t + 1, corr, corr),
            _kernel("void at::native::reduce_kernel<ArgMaxOps<float>>", t + 4, 2, corr, corr),
        ]
        t += 50
        corr += 10
    doc: dict[str, Any] = {"schemaVersion": 1}
    doc.update(meta)
    doc["traceEvents"] = events
    return doc


def _write(tmp: Path, doc: Any, name: str = "t.json", *, gz: bool = False, indent: int | None = None) -> Path:
    text = json.dumps(doc, indent=indent).encode()
    p = tmp / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(text) if gz else text)
    return p


def test_synthetic_trace_layers_passes_stages(tmp_path: Path) -> None:
    p = _write(tmp_path, _trace(layers=3, passes=3, deviceProperties=[{"id": 0, "name": "NVIDIA H100"}]), gz=True)
    r = analyze(p)
    assert r.layers_per_pass == (3, 3, 3)
    assert r.stage_passes == {"decode": 2, "prefill": 1}
    assert r.device == "NVIDIA H100"
    assert {x.kind for x in r.layers} == {"MHA_FC"}
    assert r.unknown_pct == 0


def test_kernels_link_to_launches_and_ops(tmp_path: Path) -> None:
    tl = load_trace(_write(tmp_path, _trace(layers=1, passes=1)))
    k = next(s for s in tl.spans if s.args.get("type") == "kernel" and s.category == "attention")
    assert k.args["launch_op"] == "aten::scaled_dot_product_attention"
    assert k.args["launch"] == "cudaLaunchKernel"
    assert k.args["grid"] == "4,1,1"
    assert k.track == "gpu0/stream7"
    assert isinstance(k.args["launch_us"], float) and k.args["launch_us"] < k.start_us
    assert {s.category for s in tl.spans} >= {"cpu_op", "runtime", "attention", "gemm", "norm"}
    assert tl.spans[0].start_us == 0.0


@pytest.mark.parametrize("written", [lambda v: v, str], ids=["numbers", "strings"])
def test_flow_events_link_when_correlation_missing(tmp_path: Path, written: Callable[[Any], Any]) -> None:
    doc = _trace(layers=1, passes=1)
    for e in doc["traceEvents"]:
        if e["cat"] == "kernel":
            corr = e["args"].pop("correlation")
            launch = next(
                x for x in doc["traceEvents"] if x["cat"] == "cuda_runtime" and x["args"]["correlation"] == corr
            )
            fid, start, end = written(corr), written(launch["ts"]), written(e["ts"])
            doc["traceEvents"] += [
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": 1, "tid": 1, "ts": start},
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": 0, "tid": 7, "ts": end, "bp": "e"},
            ]
    (d,) = load_trace_data(_write(tmp_path, doc))
    assert all(g.launch_name == "cudaLaunchKernel" for g in d.gpu)
    assert any("flow events" in n for n in d.notes)


def test_quirks_string_metadata_and_amd(tmp_path: Path) -> None:
    doc = _trace(layers=1, passes=1)
    doc["deviceProperties"] = json.dumps(
        [{"id": 0, "name": "", "warpSize": 64, "computeMajor": 9, "computeMinor": 4, "numSms": 304}]
    )
    doc["distributedInfo"] = str({"backend": "nccl", "rank": 3, "world_size": 8})  # Python repr, single quotes
    doc["hip_runtime_version"] = 1
    for e in doc["traceEvents"]:
        if e["cat"] == "cuda_runtime":
            e["name"] = "hipLaunchKernel"
    (d,) = load_trace_data(_write(tmp_path, doc))
    assert d.rank == 3 and d.world_size == 8
    assert d.device_name == "AMD GPU (compute 9.4, 304 CUs)"
    assert d.runtime == "hip"
    assert any("JSON string" in n for n in d.notes)
    assert any("Python-repr" in n for n in d.notes)


def test_missing_metadata_is_noted(tmp_path: Path) -> None:
    doc = {"traceEvents": [_kernel("void foo_kernel", 1.0, 1.0, 1, 1)]}
    r = analyze(_write(tmp_path, doc))
    notes = " ".join(r.notes)
    assert "no deviceProperties" in notes
    assert "no CPU op events" in notes
    assert r.unknown_kernels and r.unknown_kernels[0].name == "void foo_kernel"


def test_bare_array_format(tmp_path: Path) -> None:
    events = _trace(layers=1, passes=1)["traceEvents"]
    r = analyze(_write(tmp_path, events))
    assert r.layers_per_pass == (1,)
    assert any("bare JSON array" in n for n in r.notes)


# ---- bad input ------------------------------------------------------------------------------------


def _cli_error(args: list[str]) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_truncated_gzip(tmp_path: Path) -> None:
    good = _write(tmp_path, _trace(layers=4, passes=4), gz=True)
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(TraceFormatError, match="truncated or corrupt gzip"):
        analyze(bad)
    line = _cli_error(["analyze", str(bad)])
    assert str(bad) in line and "gzip" in line


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(_trace(layers=4, passes=2), indent=1)
    bad = tmp_path / "cut.json"
    bad.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(TraceFormatError, match="truncated JSON: the file ends inside traceEvents"):
        analyze(bad)
    assert str(bad) in _cli_error(["analyze", str(bad)])


def test_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text("this is not json\n")
    with pytest.raises(TraceFormatError, match="not a JSON trace"):
        analyze(bad)
    binary = tmp_path / "bin.json"
    binary.write_bytes(bytes(range(256)))
    line = _cli_error(["analyze", str(binary)])
    assert "bin.json" in line


def test_json_without_trace_events(tmp_path: Path) -> None:
    bad = _write(tmp_path, {"schemaVersion": 1, "deviceProperties": []})
    with pytest.raises(NoTraceEventsError, match="without a traceEvents array"):
        analyze(bad)
    assert "traceEvents" in _cli_error(["analyze", str(bad)])


def test_events_missing_fields_mark_result_incomplete(tmp_path: Path) -> None:
    doc = _trace(layers=2, passes=1)
    del doc["traceEvents"][2]["dur"]
    del doc["traceEvents"][5]["ts"]
    p = _write(tmp_path, doc)
    r = analyze(p)
    assert not r.complete
    assert any("skipped 2 events missing fields" in n for n in r.notes)
    res = CliRunner().invoke(app, ["analyze", str(p)])
    assert res.exit_code == 0
    assert "incomplete" in res.stderr and str(p) in res.stderr
    assert "INCOMPLETE" in res.stdout
    tl = load_trace(p)
    assert any(n.startswith("incomplete:") for n in tl.notes)


def test_directory_without_traces(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(TraceFormatError, match="no trace files"):
        analyze(tmp_path)
    assert str(tmp_path) in _cli_error(["analyze", str(tmp_path)])
    assert "no such file" in _cli_error(["analyze", str(tmp_path / "missing.json")])


def test_directory_of_ranks_skips_non_trace_json(tmp_path: Path) -> None:
    for rank in range(2):
        _write(
            tmp_path, _trace(layers=1, passes=1, distributedInfo={"rank": rank, "world_size": 2}), f"rank{rank}.json"
        )
    _write(tmp_path, {"results": 1}, "summary.json")
    r = analyze(tmp_path)
    assert [x.rank for x in r.ranks] == [0, 1]
    assert any("without traceEvents" in n for n in r.notes)


def test_errors_are_load_errors(tmp_path: Path) -> None:
    assert issubclass(TraceFormatError, LoadError)


# ---- the streaming parser -------------------------------------------------------------------------

_names = st.lists(st.sampled_from([*'ab{}[],: "\\\n\té', "}, {", '},{"', '}, {"x', "\u2603"]), max_size=8).map("".join)
_events = st.lists(
    st.fixed_dictionaries(
        {"ph": st.just("X"), "name": _names, "ts": st.floats(0, 1e6, allow_nan=False), "dur": st.integers(0, 99)},
        optional={
            "args": st.dictionaries(
                st.sampled_from(["a", "b", "Input Dims"]),
                st.recursive(
                    st.integers() | _names,
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(_names, c, max_size=2),
                    max_leaves=6,
                ),
                max_size=3,
            )
        },
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(events=_events, indent=st.sampled_from([None, 1, 2]), before=st.booleans())
def test_streaming_parser_equals_json_loads(events: list[dict[str, Any]], indent: int | None, before: bool) -> None:
    import tempfile

    from opgraph.trace import reader

    meta = {"deviceProperties": [{"id": 0, "name": "x"}], "traceName": "a}, {b"}
    doc = {**meta, "traceEvents": events} if before else {"traceEvents": events, **meta}
    text = json.dumps(doc, indent=indent)
    old = reader.CHUNK_CHARS
    reader.CHUNK_CHARS = 64  # force many refills and cuts inside events
    try:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "t.json"
            p.write_text(text)
            s = read_trace(p)
            got = list(s)
    finally:
        reader.CHUNK_CHARS = old
    assert got == json.loads(text)["traceEvents"]
    assert s.meta == meta


# ---- user patterns --------------------------------------------------------------------------------


def test_user_pattern_file_classifies_unknown_kernels(tmp_path: Path) -> None:
    doc = _trace(layers=1, passes=1)
    doc["traceEvents"].append(_kernel("zz_custom_op_v9", 5000.0, 4.0, 999, 999))
    p = _write(tmp_path, doc)
    before = analyze(p)
    assert [u.name for u in before.unknown_kernels] == ["zz_custom_op_v9"]
    rules = tmp_path / "mine.toml"
    rules.write_text('family = "mine"\n[[type]]\ntype = "quantization"\nmatch = ["zz_custom_op"]\n')
    after = analyze(p, patterns=[rules])
    assert not after.unknown_kernels
    assert after.patterns[0] == "mine"
    res = CliRunner().invoke(app, ["analyze", str(p), "--patterns", str(rules), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["unknown_kernels"] == []


def test_bad_pattern_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[type]]\ntype = "warp_drive"\nmatch = ["x"]\n')
    with pytest.raises(PatternError, match="unknown kernel type 'warp_drive'"):
        load_patterns([bad])
    bad.write_text("[[type]\n")
    with pytest.raises(PatternError, match="not valid TOML"):
        load_patterns([bad])
    bad.write_text('[[type]]\ntype = "gemm"\nmatch = ["(unclosed"]\n')
    with pytest.raises(PatternError, match="invalid regex"):
        load_patterns([bad])


def test_patterns_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.toml").write_text('family = "envfam"\n[[type]]\ntype = "gemm"\nmatch = ["zzz_kernel"]\n')
    monkeypatch.setenv("OPGRAPH_PATTERNS_DIR", str(tmp_path))
    ps = load_patterns()
    assert ps.families[0] == "envfam"
    assert ps.kernel_type("zzz_kernel")[0].value == "gemm"


# ---- CLI ------------------------------------------------------------------------------------------


def test_cli_analyze_outputs(tmp_path: Path) -> None:
    p = _write(tmp_path, _trace(layers=2, passes=2, deviceProperties=[{"id": 0, "name": "NVIDIA H100"}]))
    out = tmp_path / "tl.json.gz"
    js = tmp_path / "a.json"
    res = CliRunner().invoke(
        app, ["analyze", str(p), "-v", "--show-layers", "--debug-layers", "0", "-o", str(out), "--json-out", str(js)]
    )
    assert res.exit_code == 0, res.output
    assert "unknown kernels: none" in res.stdout
    assert "layer 0" in res.stdout and "MHA_FC" in res.stdout
    # --debug-layers: each kernel's type by its value and the op that launched it, shown as text.
    assert "KernelType." not in res.stdout and "[aten::" in res.stdout
    from opgraph.ir import load_timeline
    from opgraph.trace import AnalysisResult

    tl = load_timeline(out)
    assert any(s.layer == 3 for s in tl.spans)
    saved = AnalysisResult.model_validate_json(js.read_text())
    assert saved.layers_per_pass == (2, 2)
    png = tmp_path / "g.png"
    res = CliRunner().invoke(app, ["analyze", str(p), "--gantt", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    res = CliRunner().invoke(app, ["analyze", str(p), "--debug-layers", "a,b"])
    assert res.exit_code == 2 and "--debug-layers" in res.stderr


def test_cli_import(tmp_path: Path) -> None:
    p = _write(tmp_path, _trace(layers=1, passes=1))
    out = tmp_path / "tl.json"
    res = CliRunner().invoke(app, ["import", str(p), "-o", str(out), "--kernels-only"])
    assert res.exit_code == 0, res.output
    from opgraph.ir import load_timeline

    tl = load_timeline(out)
    assert tl.spans and all(s.track.startswith("gpu") for s in tl.spans)


_STREAMS_SCRIPT = """
from opgraph.ir import Span, Timeline, TimelineKind, TimelineSource
from opgraph.trace import from_timeline
tracks = [f"gpu0/queue{i}" for i in range(8)]
spans = tuple(Span(name=f"k{i}", track=t, start_us=float(i), dur_us=1.0) for i, t in enumerate(tracks))
tl = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="t"), spans=spans)
print([g.stream for g in from_timeline(tl).gpu])
"""


def test_stream_ids_of_tracks_without_one_are_the_same_in_every_process() -> None:
    # Device spans without a "stream" arg get an id from their track name; str hashes change between
    # processes (PYTHONHASHSEED), so an id taken from hash() differed from one run to the next.
    import os
    import subprocess
    import sys

    outs = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", _STREAMS_SCRIPT], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    assert outs[0] == outs[1] == outs[2]
    assert len(set(json.loads(outs[0]))) == 8  # still one id per track


def test_python_note_names_the_api_argument(tmp_path: Path) -> None:
    # The CLI has no python flag: the note must name the Python API call that keeps the events.
    events = [
        {"ph": "X", "cat": "python_function", "name": "forward", "pid": 0, "tid": 1, "ts": 0.0, "dur": 5.0},
        _kernel("gemm", 1.0, 2.0, 1, 1),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (data,) = load_trace_data(path)
    (note,) = [n for n in data.notes if "python_function" in n]
    assert "opgraph.trace.load_trace_data(path, python=True)" in note
    (kept,) = load_trace_data(path, python=True)
    assert [h.name for h in kept.host] == ["forward"]


HELDOUT = Path(__file__).resolve().parents[2] / "data" / "traces" / "heldout"


@pytest.mark.parametrize("name", ["llama8b_static_cache_generate", "qwen3moe_generate_p128_d3"])
def test_to_timeline_spans_equal_validated_spans(name: str) -> None:
    # load_trace builds its spans without pydantic's per-span checks (their fields come from the
    # validated import); validating the same data must give the same timeline, field for field.
    from opgraph.ir import Timeline

    tl = load_trace(HELDOUT / f"{name}.json.gz")
    checked = Timeline.model_validate_json(tl.model_dump_json())
    assert checked == tl
    assert [s.model_dump() for s in checked.spans] == [s.model_dump() for s in tl.spans]
    assert {type(s.category) for s in tl.spans} == {type(s.category) for s in checked.spans}
    # and the analysis through the timeline still finds what the path analysis finds
    assert analyze(tl).layers_per_pass == analyze(HELDOUT / f"{name}.json.gz").layers_per_pass


@pytest.mark.parametrize("name", ["llama8b_static_cache_generate", "qwen3moe_generate_p128_d3"])
def test_analyze_of_a_timeline_without_its_cpu_ops_is_the_full_analysis(name: str) -> None:
    # analyze() leaves a timeline's CPU ops and kernel launches out of the rebuilt ranks (it does not
    # return them); annotations and CUDA-graph launches (steps, window leftovers) stay: the same result
    from opgraph.trace import analyze_full

    tl = load_trace(HELDOUT / f"{name}.json.gz")
    assert analyze(tl) == analyze_full(tl)[0]


_DIMS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(_DIMS)
def test_shape_lists_are_saved_as_compact_json(dims: Any) -> None:
    # the fast path writes a shape list's repr; anything that is not plain nested numbers goes through JSON
    from opgraph.trace.importer import _dims_json

    text = _dims_json(dims)
    assert json.loads(text) == dims
    assert text == json.dumps(dims, separators=(",", ":"))


@pytest.mark.parametrize("name", ["llama8b_static_cache_generate", "gptoss20b_prefill128", "llama1b_generate_p64_d5"])
def test_labels_only_equal_the_full_runs_labels_and_types(name: str) -> None:
    # load_trace asks the analyzer for labels only (no summary); they and the final kernel types
    # must be what the full run gives
    from opgraph.trace.analysis import Analyzer

    ps = load_patterns(user_dirs=False)
    (full,) = load_trace_data(HELDOUT / f"{name}.json.gz")
    (lean,) = load_trace_data(HELDOUT / f"{name}.json.gz")
    assert Analyzer(ps).labels(lean) == Analyzer(ps).run(full)[1]
    assert [g.ktype for g in lean.gpu] == [g.ktype for g in full.gpu]
