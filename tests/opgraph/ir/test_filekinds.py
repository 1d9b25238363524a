"""``opgraph.ir.filekinds``: one table of the kinds of file, read by the loaders and by replay's
``describe_file``, so a file given in the wrong place is named the same way by both."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

import opgraph.ir.filekinds as filekinds
import opgraph.ir.io as io
from opgraph.ir import LoadError, OpGraph, Timeline, import_object, load_model, save_model
from opgraph.ir.filekinds import KNOWN_FILES, known_file
from validators.results import describe_file

MODELS = {
    "CostTable": "hardware:CostTable",
    "DeviceProfile": "hardware.profile:DeviceProfile",
    "HostProfile": "hardware.hostprofile:HostProfile",
    "OpGraph": "opgraph.ir:OpGraph",
    "Timeline": "opgraph.ir:Timeline",
    "ScenarioSummary": "opgraph.scenario:ScenarioSummary",
    "SimulationStats": "simulators:SimulationStats",
    "Comparison": "opgraph.compare:Comparison",
    "ServingResult": "simulators.serving:ServingResult",
    "ValidationSummary": "opgraph.scenario.validation:ValidationSummary",
    "SequenceIssue": "validators.sequence:SequenceIssue",
    "ReplayResult": "validators.results:ReplayResult",
    "CollectiveMeasurement": "validators.collectives:CollectiveMeasurement",
}
"""Where each model the table names lives (the table holds names only, so opgraph.ir imports none of them)."""


def test_doctests() -> None:
    for module in (filekinds, io):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


@pytest.mark.parametrize("kind", [k for k in KNOWN_FILES if k.model], ids=lambda k: k.model)
def test_every_kind_matches_what_its_model_writes(kind: filekinds.KnownFile) -> None:
    cls = import_object(MODELS[kind.model])
    assert isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__name__ == kind.model
    if kind.format:  # the format value the model writes
        assert cls.model_fields["format"].default == kind.format
    else:  # keys the model always writes (saved files hold every field)
        assert kind.keys <= set(cls.model_fields), sorted(kind.keys - set(cls.model_fields))


def test_each_model_is_one_kind() -> None:
    models = [k.model for k in KNOWN_FILES if k.model]
    assert len(models) == len(set(models))


def test_no_saved_type_is_taken_for_another() -> None:
    # load_model refuses a file the table calls another kind, so a file of a type must never be that
    from opgraph.cli.commands.schema import SAVED_TYPES

    for name, spec in SAVED_TYPES.items():
        cls = import_object(spec)
        assert isinstance(cls, type) and issubclass(cls, BaseModel)
        written = {k: (f.default if k == "format" else None) for k, f in cls.model_fields.items()}
        kind = known_file(written)
        assert kind is None or kind.model == cls.__name__, (name, kind)


def test_the_loader_and_describe_file_say_the_same(tmp_path: Path) -> None:
    from hardware import CostTable
    from tests.ir_builders import mm

    graph = save_model(OpGraph(ops=(mm(0, 4, 8, 16),)), tmp_path / "g.json")
    table = CostTable().save(tmp_path / "cal.json")
    for path, want, noun in ((graph, Timeline, "a Timeline"), (table, OpGraph, "an OpGraph")):
        said = known_file(json.loads(path.read_text()))
        assert said is not None
        with pytest.raises(LoadError) as info:
            load_model(path, want)
        assert info.value.message == f"is {said.description}, not {noun}"
        assert describe_file(path) == said.description
    assert describe_file(table) == "a calibrated cost table (`opgraph calibrate`)"


def test_describe_file_of_other_replay_outputs_says_what_to_do(tmp_path: Path) -> None:
    issue = tmp_path / "issue.json"
    issue.write_text('{"us_by_key": {"k": 1.0}}')
    assert describe_file(issue) == "host issue times (`opgraph replay --issue-only`: give them to --issue)"
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"traceEvents": []}\n{"traceEvents": []}\n')
    assert describe_file(lines) == "JSON lines of a torch-profiler trace, not replay results"
