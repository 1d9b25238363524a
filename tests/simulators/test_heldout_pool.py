"""``benchmarks/heldout_pool.py``: passes of the held-out measurement pooled into one data set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import heldout_pool


def _pass(folder: Path, started: str, walls: list[float], *, transformers: str = "5.24.0") -> Path:
    folder.mkdir(parents=True)
    stats = heldout_pool.stats
    case = {
        "case": "c1", "runs": len(walls), "trace_file": "c1.trace.json.gz", "trace_run": 0,
        "wall_us": stats(walls), "gpu_us": stats([100.0] * len(walls)),
    }  # fmt: skip
    (folder / "c1.json").write_text(json.dumps(case))
    (folder / "c1.config.json").write_text("{}")
    (folder / "c1.trace.json.gz").write_bytes(started.encode())
    summary = {
        "torch": "2.11", "transformers": transformers, "started_utc": started, "runs_per_case": len(walls),
        "cases": [{"case": "c1", "status": "ok", "gpu_us": 100.0, "wall_us": stats(walls)["median"]}],
    }  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_pooled_case_takes_the_median_over_every_pass_and_keeps_the_first_pass_trace(tmp_path: Path) -> None:
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    b = _pass(tmp_path / "b", "12:16", [5.0, 5.1, 5.2])
    c = _pass(tmp_path / "c", "12:17", [6.0, 6.1, 6.2])
    summary = heldout_pool.pool([a, b, c], tmp_path / "out")
    case = json.loads((tmp_path / "out" / "c1.json").read_text())
    assert case["wall_us"]["median"] == pytest.approx(6.1) and case["runs"] == 9
    assert [p["wall_us"] for p in case["passes"]] == [8.1, 5.1, 6.1]
    assert (tmp_path / "out" / "c1.trace.json.gz").read_bytes() == b"11:17"
    assert summary["cases"][0]["wall_us"] == pytest.approx(6.1) and summary["runs_per_case"] == 9
    assert [p["started_utc"] for p in summary["passes"]] == ["11:17", "12:16", "12:17"]


def test_passes_of_other_library_versions_are_refused(tmp_path: Path) -> None:
    a = _pass(tmp_path / "a", "1", [1.0, 2.0])
    b = _pass(tmp_path / "b", "2", [1.0, 2.0], transformers="5.17.0")
    with pytest.raises(heldout_pool.PoolError, match=r"transformers 5\.17\.0"):
        heldout_pool.pool([a, b], tmp_path / "out")
    assert heldout_pool.main([str(a), str(b), "-o", str(tmp_path / "x.tar.gz")]) == 2
    assert not (tmp_path / "x.tar.gz").exists()
