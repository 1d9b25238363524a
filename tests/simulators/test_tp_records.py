"""What the TP benchmark scripts share: their records' base (``FrozenModel``) and their command
line (``benchmarks/gpu/gpu_cli.py``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

import gpu_cli  # noqa: E402
import tp_predict  # noqa: E402
import tp_run  # noqa: E402

from opgraph.ir import FrozenModel  # noqa: E402

RECORDS = [
    obj
    for module in (tp_run, tp_predict)
    for obj in vars(module).values()
    if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
]


def test_every_tp_record_is_a_frozen_record() -> None:
    assert len(RECORDS) >= 10
    assert [r.__name__ for r in RECORDS if not issubclass(r, FrozenModel)] == []


def test_records_are_immutable_refuse_unknown_fields_and_document_their_schema() -> None:
    case = tp_run.TpCase(model="m", phase="decode", tp=2, batch=8, kv_len=2048)
    with pytest.raises(ValidationError):
        case.tp = 4
    with pytest.raises(ValidationError, match="extra"):
        tp_run.TpCase.model_validate({**case.model_dump(), "pipeline": 2})
    props = tp_predict.RankPrediction.model_json_schema()["properties"]
    assert props["compute_us"]["description"] == "Union of its compute spans."


def test_entry_point_parses_argv_runs_and_exits_0() -> None:
    seen: list[argparse.Namespace] = []

    def parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
        ap = gpu_cli.parser("doc")
        ap.add_argument("--n", type=int, default=0)
        return ap.parse_args(list(argv) if argv is not None else None)

    main = gpu_cli.entry_point(seen.append, parse_args, "Entry point of a test script.")
    assert main(["--n", "3"]) == 0
    assert [a.n for a in seen] == [3]
    assert main.__doc__ == "Entry point of a test script."


def test_scripts_show_their_docstring_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tp_predict.main(["--help"])
    assert exc.value.code == 0
    example = next(line for line in (tp_predict.__doc__ or "").splitlines() if "tp_predict.py --measured" in line)
    assert example in capsys.readouterr().out.splitlines()


def test_scripts_refuse_a_bad_option_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tp_run.main(["--out", "unused", "--phases", "train"])
    assert exc.value.code == 2
    assert "--phases: unknown phase 'train'" in capsys.readouterr().err
