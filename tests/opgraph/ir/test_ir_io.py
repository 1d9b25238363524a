"""Saving and loading: round trips, schema versions, and a fuzzed loader that only raises typed errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_strategies import graphs

from opgraph.ir import (
    CycleError,
    Edge,
    Elementwise,
    LoadError,
    OpGraph,
    OpgraphError,
    SchemaVersionError,
    Span,
    Timeline,
    TimelineKind,
    TimelineSource,
    load_graph,
    load_timeline,
    save_graph,
    save_timeline,
)
from opgraph.ir.io import atomic_write

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graphs(), st.sampled_from([".json", ".json.gz"]))
def test_graph_round_trip(tmp_path: Path, g: OpGraph, suffix: str) -> None:
    path = save_graph(g, tmp_path / f"g{suffix}")
    assert load_graph(path) == g
    assert OpGraph.model_validate_json(g.model_dump_json()) == g


def test_timeline_round_trip_and_sorting(tmp_path: Path) -> None:
    spans = (
        Span(name="b", track="e1", start_us=5, dur_us=1),
        Span(name="a", track="e0", start_us=0, dur_us=2, op_id=3),
    )
    t = Timeline(source=TimelineSource(kind=TimelineKind.SIMULATED, name="sim"), spans=spans)
    assert [s.name for s in t.spans] == ["a", "b"]
    assert t.makespan_us == 6 and t.busy_us() == 3 and t.tracks() == ["e0", "e1"]
    assert load_timeline(save_timeline(t, tmp_path / "t.json.gz")) == t


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "g.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write(b"partial")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]


def _write(tmp_path: Path, data: bytes, name: str = "g.json") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _graph_json() -> dict[str, object]:
    g = OpGraph(
        ops=(Elementwise(id=0, fn="add", numel=4), Elementwise(id=1, fn="mul", numel=4)), edges=(Edge(src=0, dst=1),)
    )
    raw: dict[str, object] = json.loads(g.model_dump_json())
    return raw


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=3), "schema_version 3 is newer than this opgraph's 2"),
        (lambda d: d.update(schema_version="x"), "not an OpGraph file"),
        (lambda d: d["ops"][0].update(numel=-3), "ops.0.elementwise.numel: Input should be greater than or equal to 0"),
        (lambda d: d["ops"][0].update(kind="warp"), "ops.0: Input tag 'warp' found using 'kind' does not match"),
        (lambda d: d.update(ops="nope"), "ops: Input should be a valid"),
        (lambda d: d["edges"][0].update(dst=7), "edges.0.dst"),
    ],
)
def test_bad_graph_files_give_one_line(tmp_path: Path, mutate: object, message: str) -> None:
    raw = _graph_json()
    mutate(raw)  # type: ignore[operator]
    p = _write(tmp_path, json.dumps(raw).encode())
    with pytest.raises(OpgraphError) as info:
        load_graph(p)
    line = info.value.one_line()
    assert "\n" not in line and str(p) in line and message in line


def test_cycle_and_version_errors_are_typed(tmp_path: Path) -> None:
    raw = _graph_json()
    raw["edges"] = [{"src": 0, "dst": 1}, {"src": 1, "dst": 0}]
    with pytest.raises(CycleError, match="dependency cycle"):
        load_graph(_write(tmp_path, json.dumps(raw).encode()))
    raw = _graph_json()
    raw["schema_version"] = 9
    with pytest.raises(SchemaVersionError, match="upgrade opgraph"):
        load_graph(_write(tmp_path, json.dumps(raw).encode()))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "file is empty"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (gzip.compress(b'{"ops": []}' * 50, mtime=0)[:30], "truncated or corrupt gzip"),
        (b"\xff\xfe\x00binary", "not valid JSON"),
    ],
    ids=["empty", "not-json", "json-array", "truncated-gzip", "binary"],
)
def test_unreadable_files(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        load_graph(_write(tmp_path, data))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no such file"):
        load_graph(tmp_path / "absent.json")
    with pytest.raises(LoadError, match="is a directory"):
        load_graph(tmp_path)


@FUZZ
@given(graphs(max_ops=6), st.data())
def test_loader_fuzz_structured(tmp_path: Path, g: OpGraph, data: st.DataObject) -> None:
    """Mutate values anywhere in a valid file: the loader returns a graph or raises our typed errors."""
    raw = json.loads(g.model_dump_json())
    replacement = data.draw(
        st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.lists(st.integers(), max_size=2))
    )
    node: object = raw
    path: list[object] = []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]  # type: ignore[index]
    if path:
        parent: object = raw
        for k in path[:-1]:
            parent = parent[k]  # type: ignore[index]
        parent[path[-1]] = replacement  # type: ignore[index]
    p = _write(tmp_path, json.dumps(raw).encode())
    try:
        load_graph(p)
    except OpgraphError as exc:
        assert "\n" not in exc.one_line()


@FUZZ
@given(graphs(max_ops=4), st.data())
def test_loader_fuzz_bytes(tmp_path: Path, g: OpGraph, data: st.DataObject) -> None:
    """Flip, cut and insert bytes (and gzip the result sometimes): never anything but typed errors."""
    blob = bytearray(g.model_dump_json().encode())
    for _ in range(data.draw(st.integers(1, 4))):
        if not blob:
            break
        i = data.draw(st.integers(0, len(blob) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            blob[i] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del blob[i:]
        else:
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    out = bytes(blob)
    if data.draw(st.booleans()):
        out = gzip.compress(out)
        out = out[: data.draw(st.integers(0, len(out)))]
    p = _write(tmp_path, out)
    try:
        load_graph(p)
    except OpgraphError as exc:
        assert "\n" not in exc.one_line()
