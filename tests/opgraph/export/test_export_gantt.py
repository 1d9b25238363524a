"""Gantt PNG: written atomically, one panel per timeline, kinds in their colours, layer starts found."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_fixtures import graph, measured, plain, simulated

from opgraph.export import KIND_COLORS, ExportError, write_gantt
from opgraph.export.gantt import layer_starts


def _pixels(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return (img[:, :, :3] * 255).round().astype(int)


def _has_color(px: np.ndarray, hex_color: str, min_count: int = 20) -> bool:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(px - rgb).sum(axis=2) <= 3).sum()) >= min_count


def test_two_timelines_one_axis_coloured_by_kind(tmp_path: Path) -> None:
    g = graph()
    out = write_gantt([simulated(g), measured(g)], tmp_path / "g.png", title="demo")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    px = _pixels(out)
    for kind in ("gemm", "attention", "norm"):
        assert _has_color(px, KIND_COLORS[kind]), kind
    assert not _has_color(px, KIND_COLORS["collective"])  # no collectives in the graph
    single = _pixels(write_gantt([simulated(g)], tmp_path / "one.png"))
    assert px.shape[0] > single.shape[0]  # a second panel stacked below


def test_many_spans(tmp_path: Path) -> None:
    spans = [(f"k{i % 5}", f"stream {i % 4}", float(i), 0.8) for i in range(20000)]
    out = write_gantt([plain(spans)], tmp_path / "many.png")
    assert out.stat().st_size > 1000


def test_layer_starts() -> None:
    g = graph(layers=3)
    starts = layer_starts(simulated(g), g)
    assert [layer for layer, _ in starts] == [0, 1, 2]
    assert [t for _, t in starts] == sorted(t for _, t in starts)
    assert layer_starts(plain([("a", "e", 0, 1)])) == []


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"\.png"):
        write_gantt([plain([("a", "e", 0, 1)])], tmp_path / "g.jpg")
    with pytest.raises(ExportError, match="at least one timeline"):
        write_gantt([], tmp_path / "g.png")
    assert not list(tmp_path.iterdir())
