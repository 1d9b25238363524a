"""The golden-file helper never passes by writing the file it should compare with."""

from __future__ import annotations

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
