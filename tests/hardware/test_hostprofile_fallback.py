"""The host time of torch's ``_grouped_mm`` fallback, measured on the host profile's CPU: fitted from a
``grouped_fallback_host.py`` result, looked up for the products capture marks as the fallback's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware.hostfit import fit_fallback_loops, main, with_fallback_loops
from hardware.hostprofile import FallbackLoop, fallback_issue_us, load_host_profile
from opgraph.ir import ExpertGemm, Gemm, HostIssue, OpgraphError, save_graph
from tests.hardware.host_builders import toy_graph, toy_profile

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "benchmarks" / "results" / "gpu" / "h100" / "host-profile" / "grouped_fallback_host.json"


def _rows(experts: int, n: int, k: int, first: float, per: float, actives: tuple[int, ...]) -> list[dict[str, object]]:
    """A measurement whose host time is exactly ``first + (active - 1) * per``, the same at every row count."""
    return [
        {"shape": "s", "experts": experts, "n": n, "k": k, "rows": r, "active": a, "idle_us": first + (a - 1) * per}
        for r in (1, 4, 128)
        for a in actives
    ]


def _expert_op(experts: int, n: int, k: int, issue: HostIssue) -> Gemm:
    expert = ExpertGemm(impl="grouped_mm", experts=experts, top_k=2, part="gate_up")
    return Gemm(id=0, m=4, n=n, k=k, expert=expert, issue=issue)


def test_the_line_through_the_loads_gives_the_first_expert_and_each_further_one() -> None:
    rows = _rows(8, 28672, 4096, 50.0, 16.0, (1, 2, 4, 8)) + _rows(128, 1536, 2048, 290.0, 11.0, (1, 16, 64, 128))
    rows.append({"shape": "s", "mm_us": 14.0})  # the Python-level mm line is not a load
    rows += _rows(4, 64, 64, 10.0, 1.0, (4,))  # one load only: no line
    loops = fit_fallback_loops({"rows": rows})
    assert [(x.experts, x.n, x.k) for x in loops] == [(8, 28672, 4096), (128, 1536, 2048)]
    assert [(x.first_us, x.per_expert_us, x.calls) for x in loops] == [(50.0, 16.0, 12), (290.0, 11.0, 12)]


def test_the_row_count_does_not_move_the_fit_its_median_is_taken() -> None:
    rows = _rows(8, 64, 64, 50.0, 16.0, (1, 8))
    rows[0] = {**rows[0], "idle_us": 5000.0}  # one disturbed call among three row counts
    (loop,) = fit_fallback_loops({"rows": rows})
    assert (loop.first_us, loop.per_expert_us) == (50.0, 16.0)


def test_the_nearest_loop_keeps_the_expert_count_before_the_shape() -> None:
    small = FallbackLoop(experts=8, n=2048, k=2048, first_us=50.0, per_expert_us=16.0, calls=4)
    large = FallbackLoop(experts=128, n=1536, k=2048, first_us=290.0, per_expert_us=11.0, calls=4)
    other = FallbackLoop(experts=128, n=8192, k=8192, first_us=300.0, per_expert_us=30.0, calls=4)
    prof = toy_profile(grouped_fallback=(small, large, other))
    assert fallback_issue_us(prof, _expert_op(128, 2048, 2048, HostIssue.SYNC)) == 290.0
    assert fallback_issue_us(prof, _expert_op(128, 2048, 2048, HostIssue.NESTED)) == 11.0
    assert fallback_issue_us(prof, _expert_op(8, 1536, 2048, HostIssue.NESTED)) == 16.0
    # a Python-level expert call, a dense GEMM, or a profile without loops: not the fallback's
    assert fallback_issue_us(prof, _expert_op(8, 1536, 2048, HostIssue.CALL)) is None
    assert fallback_issue_us(prof, Gemm(id=0, m=4, n=64, k=64, issue=HostIssue.NESTED)) is None
    assert fallback_issue_us(toy_profile(), _expert_op(8, 1536, 2048, HostIssue.SYNC)) is None


def test_the_committed_h100_measurement_fits_every_shape_it_measured() -> None:
    if not MEASURED.is_file():
        pytest.skip(f"no committed measurement ({MEASURED.relative_to(REPO)})")
    measured = json.loads(MEASURED.read_text())
    loops = fit_fallback_loops(measured)
    assert {(x.experts, x.n, x.k) for x in loops} == {
        (int(r["experts"]), int(r["n"]), int(r["k"])) for r in measured["rows"] if "idle_us" in r
    }
    for x in loops:  # each further expert costs a loop step and a launch: more than nothing, less than a call
        assert 1.0 < x.per_expert_us < x.first_us


def test_hostfit_adds_the_loops_with_a_note_and_bad_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = tmp_path / "fallback.json"
    measured.write_text(json.dumps({"device": "Toy GPU", "date": "d", "rows": _rows(8, 64, 64, 50.0, 16.0, (1, 8))}))
    graphs = [save_graph(toy_graph(2, n), tmp_path / f"g{i}.json") for i, n in enumerate((-1.0, 1.0, 0.0))]
    out = tmp_path / "toy.host.json"
    assert main([*map(str, graphs), "-o", str(out), "--fallback", str(measured)]) == 0
    prof = load_host_profile(out)
    assert prof.grouped_fallback == (FallbackLoop(experts=8, n=64, k=64, first_us=50.0, per_expert_us=16.0, calls=6),)
    assert any(n.startswith("grouped_fallback:") and "Toy GPU" in n for n in prof.notes)
    # refitting keeps one note, not two
    assert sum(n.startswith("grouped_fallback:") for n in with_fallback_loops(prof, measured).notes) == 1
    capsys.readouterr()
    broken = {"rows": [{"experts": 8, "n": 64, "active": 1, "idle_us": "fast"}]}
    for text in ("{not json", "[]", json.dumps({"rows": _rows(8, 64, 64, 50.0, 16.0, (8,))}), "{}", json.dumps(broken)):
        measured.write_text(text)
        with pytest.raises(OpgraphError) as info:
            with_fallback_loops(prof, measured)
        assert "\n" not in str(info.value)
        assert main([*map(str, graphs), "-o", str(tmp_path / "x.host.json"), "--fallback", str(measured)]) == 2
        err = capsys.readouterr().err
        assert str(measured) in err
        assert err.count("\n") == 1
    assert main([*map(str, graphs), "-o", str(out), "--fallback", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
