"""``benchmarks/heldout_pool.py``: passes of the held-out measurement pooled into one data set."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
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


def _walls(probes: list[tuple[float, float]], runs: dict[str, list[list[float]]], **extra: str) -> dict[str, object]:
    """A round-robin run's ``walls.json``: one probe per round, each case's walls per round."""
    return {
        "timed_per_round": 2,
        "host_probes": [{"round": r, "launch_us": a, "python_loop_ns": b} for r, (a, b) in enumerate(probes)],
        "cases": [
            {"case": name, "role": "train" if name.startswith("t") else "heldout",
             "walls": [{"round": r, "us": w} for r, ws in enumerate(per_round) for w in ws]}
            for name, per_round in runs.items()
        ],
        "torch": "2.11", "transformers": "5.24.0", "started_utc": "14:50", **extra,
    }  # fmt: skip


def test_quiet_rounds_are_chosen_by_the_host_probe_alone() -> None:
    # Round 1's launch probe and round 2's Python probe are slow; the walls play no part in the choice.
    data = _walls([(6.5, 34.0), (9.5, 35.0), (6.6, 70.0), (7.0, 36.0)], {"c1": [[5.0], [1.0], [1.0], [5.2]]})
    assert heldout_pool.quiet_rounds(data["host_probes"]) == [0, 3]  # type: ignore[arg-type]
    assert heldout_pool.quiet_walls(data) == {"c1": [5.0, 5.2]}
    assert heldout_pool.quiet_walls(data, "train") == {}
    assert "the 2 rounds whose probes" in heldout_pool.walls_method(data)


def test_round_robin_walls_replace_the_passes_walls(tmp_path: Path) -> None:
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    quiet = [[5.0 + i / 10, 5.05 + i / 10] for i in range(5)]
    data = _walls([(6.5, 34.0)] * 5 + [(10.0, 70.0)], {"c1": [*quiet, [9.0, 9.0]], "t1": [[1.0, 1.0]] * 6})
    summary = heldout_pool.pool([a], tmp_path / "out", [data])
    case = json.loads((tmp_path / "out" / "c1.json").read_text())
    kept = sorted(w for ws in quiet for w in ws)
    assert case["wall_us"]["runs"] == kept and case["wall_us"]["median"] == pytest.approx((kept[4] + kept[5]) / 2)
    assert case["wall_us_passes"]["median"] == pytest.approx(8.1)  # the passes' walls kept beside it
    assert summary["cases"][0]["wall_us"] == case["wall_us"]["median"]
    assert "round robin" in summary["walls"]["method"] and summary["walls"]["started_utc"] == "14:50"


def test_round_robin_walls_must_be_enough_and_of_the_same_libraries(tmp_path: Path) -> None:
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    few = _walls([(6.5, 34.0)] * 4, {"c1": [[5.0, 5.0]] * 4})  # 8 quiet walls
    with pytest.raises(heldout_pool.PoolError, match="c1: 8 quiet round-robin walls, at least 9"):
        heldout_pool.pool([a], tmp_path / "out", [few])
    other = _walls([(6.5, 34.0)] * 5, {"c1": [[5.0, 5.0]] * 5}, transformers="5.17.0")
    with pytest.raises(heldout_pool.PoolError, match=r"--walls run of 14:50: transformers 5\.17\.0"):
        heldout_pool.pool([a], tmp_path / "out2", [few, other])


def test_a_case_no_round_robin_run_built_keeps_the_passes_walls_only_when_asked(tmp_path: Path) -> None:
    # The device's memory held the other models, not this one: no run has a wall of it.
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    other = _walls([(6.5, 34.0)] * 5, {"c2": [[5.0, 5.0]] * 5})
    with pytest.raises(heldout_pool.PoolError, match="c1: 0 quiet round-robin walls"):
        heldout_pool.pool([a], tmp_path / "out", [other])
    summary = heldout_pool.pool([a], tmp_path / "out2", [other], pass_walls_where_unbuilt=True)
    case = json.loads((tmp_path / "out2" / "c1.json").read_text())
    assert case["wall_source"] == heldout_pool.PASS_WALLS and case["wall_us"]["median"] == pytest.approx(8.1)
    assert summary["cases"][0]["wall_us"] == pytest.approx(8.1)
    # A case a run built but whose quiet walls are too few is still refused.
    few = _walls([(6.5, 34.0)] * 4, {"c1": [[5.0, 5.0]] * 4})
    with pytest.raises(heldout_pool.PoolError, match="c1: 8 quiet round-robin walls"):
        heldout_pool.pool([a], tmp_path / "out3", [few], pass_walls_where_unbuilt=True)


def test_walls_of_several_round_robin_runs_pool_each_runs_quiet_rounds(tmp_path: Path) -> None:
    # Run 2's host is slower throughout: its quiet rounds are those near ITS fastest probe, not run 1's.
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    run1 = _walls([(6.5, 34.0)] * 3 + [(10.0, 70.0)], {"c1": [[5.0, 5.0]] * 3 + [[9.0, 9.0]]})
    run2 = _walls([(7.5, 40.0)] * 2 + [(12.0, 90.0)], {"c1": [[5.4, 5.4]] * 2 + [[9.5, 9.5]]}, started_utc="16:31")
    assert heldout_pool.pooled_quiet_walls([run1, run2]) == {"c1": [5.0] * 6 + [5.4] * 4}
    summary = heldout_pool.pool([a], tmp_path / "out", [run1, run2])
    assert summary["cases"][0]["wall_us"] == pytest.approx(5.0)
    assert summary["walls"]["started_utc"] == "14:50, 16:31"
    method = summary["walls"]["method"]
    assert "2 round-robin runs pooled" in method and "16:31: 3 rounds, 2 quiet" in method


def test_round_robin_run_on_the_cpu_measures_every_case_in_every_round(tmp_path: Path) -> None:
    """``heldout.py --round-robin`` (tiny models on the CPU): rounds numbered across the groups, one probe
    each, every built case timed ``--timed-per-round`` times per round; ``load_walls`` reads its tarball."""
    out = tmp_path / "heldout"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu" / "heldout.py"), "--device", "cpu", "--tiny",
         "--round-robin", "2", "--timed-per-round", "2", "--train-walls", "--cases",
         "tiny_llama_decode_b2_kv64_fp16,tiny_qwen2_prefill_b2_s16_fp16", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(tmp_path / "walls.tar.gz", "w:gz") as tar:
        tar.add(out, arcname="heldout")
    data = heldout_pool.load_walls(tmp_path / "walls.tar.gz")
    assert [(p["round"], p["group"]) for p in data["host_probes"]] == [
        (0, "heldout"),
        (1, "heldout"),
        (2, "train"),
        (3, "train"),
    ]
    roles = {c["case"] + "/" + c["role"]: sorted({w["round"] for w in c["walls"]}) for c in data["cases"]}
    assert roles["tiny_qwen2_prefill_b2_s16_fp16/heldout"] == [0, 1]
    assert [r for k, r in roles.items() if k.endswith("/train")] == [[2, 3], [2, 3]]
    assert all(len(c["walls"]) == 4 and all(w["us"] > 0 for w in c["walls"]) for c in data["cases"])
    assert all((out / c["config_file"]).is_file() for c in data["cases"])
    assert data["transformers"] and data["started_utc"]  # the run's provenance, from its summary


def test_a_walls_file_that_is_no_round_robin_run_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    a = _pass(tmp_path / "a", "11:17", [8.0, 8.1, 8.2])
    bad = tmp_path / "bad.tar.gz"
    bad.write_text("not a tarball")
    out = tmp_path / "x.tar.gz"
    assert heldout_pool.main([str(a), "-o", str(out), "--walls", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad}: not a folder or .tar.gz") and "\n" not in err
    assert heldout_pool.main([str(a), "-o", str(out), "--walls", str(a)]) == 2  # passes, not a round-robin run
    assert "no walls.json" in capsys.readouterr().err and not out.exists()
