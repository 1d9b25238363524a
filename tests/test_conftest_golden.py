"""The golden-file helper never passes by writing the file it should compare with."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import tests.conftest as conftest


def test_a_missing_golden_fails_outside_ci_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "GOLDEN", tmp_path)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("OPGRAPH_UPDATE_GOLDEN", raising=False)
    with pytest.raises(pytest.fail.Exception, match="is missing"):
        conftest.check_golden("area/new.json", {"a": 1})
    assert not (tmp_path / "area" / "new.json").exists()


def test_update_writes_then_compares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "GOLDEN", tmp_path)
    monkeypatch.setenv("OPGRAPH_UPDATE_GOLDEN", "1")
    conftest.check_golden("area/new.json", {"a": 1})
    monkeypatch.delenv("OPGRAPH_UPDATE_GOLDEN")
    conftest.check_golden("area/new.json", {"a": 1})
    with pytest.raises(AssertionError, match="differs from golden"):
        conftest.check_golden("area/new.json", {"a": 2})


GOLDEN_DATA = {
    "name": "decoder",
    "points": [{"n": 1, "ok": True, "speedup": 1.0}, {"n": 2, "ok": False, "speedup": 1 / 3}],
    "x": None,
}


def _write_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: object) -> None:
    monkeypatch.setattr(conftest, "GOLDEN", tmp_path)
    monkeypatch.setenv("OPGRAPH_UPDATE_GOLDEN", "1")
    conftest.check_golden("area/data.json", data)  # type: ignore[arg-type]
    monkeypatch.delenv("OPGRAPH_UPDATE_GOLDEN")


def _changed(path: list[str | int], value: object) -> dict[str, object]:
    data = json.loads(json.dumps(GOLDEN_DATA))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_a_float_one_ulp_off_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Float sums differ in their last digit between CPUs and numpy builds: not a golden mismatch."""
    _write_golden(tmp_path, monkeypatch, GOLDEN_DATA)
    off = math.nextafter(1 / 3, 1.0)
    assert off != 1 / 3
    conftest.check_golden("area/data.json", _changed(["points", 1, "speedup"], off))
    conftest.check_golden("area/data.json", _changed(["points", 0, "speedup"], math.nextafter(1.0, 0.0)))


def test_a_float_off_by_a_millionth_fails_naming_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_golden(tmp_path, monkeypatch, GOLDEN_DATA)
    with pytest.raises(AssertionError) as failed:
        conftest.check_golden("area/data.json", _changed(["points", 1, "speedup"], (1 / 3) * (1 + 1e-6)))
    message = str(failed.value)
    assert "differs from golden" in message and str(tmp_path / "area" / "data.json") in message
    assert "points[1].speedup" in message and "0.3333333333333333" in message and "0.33333366666" in message
    assert "rerun with OPGRAPH_UPDATE_GOLDEN=1 if intended" in message


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (_changed(["name"], "encoder"), "name"),
        (_changed(["points", 0, "n"], 2), "points[0].n"),
        (_changed(["points", 0, "n"], 1.0000001), "points[0].n"),
        (_changed(["points", 0, "ok"], False), "points[0].ok"),
        (_changed(["points", 0, "ok"], 1), "points[0].ok"),  # a bool is not a number
        (_changed(["points", 0, "speedup"], "1.0"), "points[0].speedup"),
        (_changed(["x"], 0), "x"),
        (_changed(["points"], GOLDEN_DATA["points"][:1]), "points"),  # type: ignore[index]
        ({**GOLDEN_DATA, "extra": 1}, "extra"),
        ({k: v for k, v in GOLDEN_DATA.items() if k != "x"}, "'x'"),
    ],
)
def test_a_changed_value_key_or_length_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, object], where: str
) -> None:
    _write_golden(tmp_path, monkeypatch, GOLDEN_DATA)
    with pytest.raises(AssertionError, match="differs from golden") as failed:
        conftest.check_golden("area/data.json", data)
    assert where in str(failed.value) and "OPGRAPH_UPDATE_GOLDEN=1" in str(failed.value)


def test_an_int_golden_matches_an_equal_float(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_golden(tmp_path, monkeypatch, {"count": 3, "sum": 0.0})
    conftest.check_golden("area/data.json", {"count": 3.0, "sum": 1e-15})
    with pytest.raises(AssertionError, match=r"count: golden 3, actual 3\.5"):
        conftest.check_golden("area/data.json", {"count": 3.5, "sum": 0.0})


def test_text_goldens_stay_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "GOLDEN", tmp_path)
    monkeypatch.setenv("OPGRAPH_UPDATE_GOLDEN", "1")
    conftest.check_golden("area/out.txt", "speedup 0.3333333333333333\n")
    monkeypatch.delenv("OPGRAPH_UPDATE_GOLDEN")
    with pytest.raises(AssertionError, match="differs from golden"):
        conftest.check_golden("area/out.txt", "speedup 0.33333333333333337\n")
