"""The scenario file format: validation, one-line errors naming file and field, the JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.scenario import (
    Bound,
    Limit,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_engines,
    parse_scenario,
    planned_checks,
    scenario_name,
)
from tests.conftest import check_golden

REPO = Path(__file__).resolve().parents[3]
DEFAULT = REPO / "examples" / "scenarios" / "default.scenario.toml"

MINIMAL = """
[model]
source = "llama-3.2-1b"
[[phases]]
phase = "prefill"
"""


def write(tmp_path: Path, text: str, name: str = "s.scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    line = info.value.one_line()
    assert "\n" not in line
    assert line.startswith(str(path))
    return line


def test_default_scenario_is_valid() -> None:
    s = load_scenario(DEFAULT)
    assert s.model is not None and s.model.source == "llama-3.1-8b"
    assert [p.label for p in s.phases] == ["prefill", "decode"]
    assert s.simulation.engine_counts == (1, 2, 3)
    assert s.hardware.name == "h100" and s.hardware.cost_model == "roofline"
    # Top-level expectations reach every phase; a phase's own are added to them.
    for p in s.phases:
        exp = s.expectations(p)
        assert exp.operators == "llama"
        assert exp.makespan_us is not None and exp.makespan_us.engines == 1
    assert s.expectations(s.phases[0]).makespan_us != s.expectations(s.phases[1]).makespan_us
    assert scenario_name(s, DEFAULT) == "llama-3.1-8b-h100"


def test_minimal_scenario_defaults(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINIMAL))
    assert s.simulation.engine_counts == (1,)
    assert s.hardware.name == "h100"
    assert s.replay is None and s.phases[0].measured is None
    assert planned_checks(s) == []
    assert scenario_name(s, tmp_path / "s.scenario.toml") == "s"


def test_round_trip(tmp_path: Path) -> None:
    s = load_scenario(DEFAULT)
    assert Scenario.model_validate_json(s.model_dump_json()) == s


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[model\n", "not valid TOML"),
        (MINIMAL + "[hardware]\nnmae = 'h100'\n", "hardware.nmae: unknown field (did you mean 'name'?)"),
        (MINIMAL.replace('phase = "prefill"', 'phase = "prefil"'), "phases[0].phase: Input should be"),
        (MINIMAL + "bacth = 2\n", "phases[0].bacth: unknown field (did you mean 'batch'?)"),
        (MINIMAL + "[simulation]\nengines = '4..2'\n", "simulation.engines: empty range"),
        (MINIMAL + "[simulation]\nengines = [0, 2]\n", "simulation.engines: engine count 0 is out of range"),
        (MINIMAL + "[expect]\nmakespan_us = {}\n", "expect.makespan_us: give min, max or both"),
        (MINIMAL + "[expect]\nmakespan_us = {min = 5, max = 1}\n", "min 5 is above max 1"),
        (MINIMAL + "[expect]\nmax_error = {gpu_time = 0.2}\n", "needs a phase with a measured timeline"),
        (MINIMAL + "[expect]\nreplay_failures = 0\n", "replay_failures needs a [replay] section"),
        (MINIMAL + "[expect]\nmakespan_us = {max = 5, engines = 3}\n", "is not a simulated count [1]"),
        ("[[phases]]\nphase = 'decode'\n", "has no graph and the scenario has no [model]"),
        (MINIMAL + "[[phases]]\nphase = 'prefill'\n", "phase names must be unique"),
        (MINIMAL + "[replay]\nkinds = ['gem']\n", "replay.kinds[0]: Input should be 'gemm'"),
        ("[[phases]]\ngraph = 'g.json'\n[unknown]\nx = 1\n", "unknown: unknown field"),
        (
            MINIMAL + "[simulation]\nhost = 'none'\nhost_us = 5\n",
            "simulation.host_us: 5 us per op has no host to spend it: host mode none issues every op at time zero "
            "(remove host_us, or give host = 'eager' or 'cuda-graph')",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


@pytest.mark.parametrize(("host", "host_us"), [("none", 0.0), ("eager", 5.0), ("cuda-graph", 5.0), ("none", None)])
def test_a_host_time_goes_with_a_host(tmp_path: Path, host: str, host_us: float | None) -> None:
    # only a positive time per op with no host contradicts itself (as `opgraph simulate --host none --host-us`)
    given = "" if host_us is None else f"host_us = {host_us}\n"
    s = load_scenario(write(tmp_path, MINIMAL + f"[simulation]\nhost = '{host}'\n{given}"))
    assert (s.simulation.host, s.simulation.host_us) == (host, host_us)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "nope.scenario.toml")
    with pytest.raises(ScenarioError, match="is a folder"):
        load_scenario(tmp_path)


def test_parse_scenario_names_where() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"phases": []}, "inline")
    assert info.value.one_line().startswith("inline: phases:")


def test_phase_labels_from_graph_files() -> None:
    s = parse_scenario({"phases": [{"graph": "data/llama 1b.graph.json.gz"}, {"graph": "x.json", "name": "mine"}]})
    assert [p.label for p in s.phases] == ["llama-1b", "mine"]


def test_planned_checks_follow_expectations() -> None:
    s = parse_scenario(
        {
            "model": {"source": "llama-3.2-1b"},
            "simulation": {"engines": [1, 2]},
            "replay": {"max_configs": 2},
            "expect": {"operators": ["linear"], "speedup": {"min": 1}, "replay_failures": 0},
            "phases": [
                {"phase": "prefill", "measured": "m.json", "expect": {"max_error": {"gpu_time": 0.3, "median_op": 1}}},
                {"phase": "decode", "expect": {"makespan_us": {"max": 10, "engines": 2}}},
            ],
        }
    )
    assert planned_checks(s) == [
        "prefill/operators",
        "prefill/speedup",
        "prefill/max_error.gpu_time",
        "prefill/max_error.median_op",
        "decode/operators",
        "decode/makespan_us",
        "decode/speedup",
        "replay/replay_failures",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, (3,)), ([4, 1, 4], (1, 4)), ("1..4", (1, 2, 3, 4)), ("2, 8", (2, 8)), (" 2 .. 3 ", (2, 3))],
)
def test_parse_engines(value: int | list[int] | str, expected: tuple[int, ...]) -> None:
    assert parse_engines(value) == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=64))
def test_parse_engines_sorted_unique(counts: list[int]) -> None:
    out = parse_engines(counts)
    assert list(out) == sorted(set(counts))


@pytest.mark.parametrize("bad", ["", "a", "0", "3..1", "1..100", [0], [5000]])
def test_parse_engines_rejects(bad: int | list[int] | str) -> None:
    with pytest.raises(ValueError):
        parse_engines(bad)


def test_json_schema_golden() -> None:
    schema = Scenario.model_json_schema()
    # Attribute docstrings land in the schema: a user reading it learns what each field means.
    assert "preset" in schema["$defs"]["ModelSpec"]["properties"]["source"]["description"]
    check_golden("scenario/scenario.schema.json", json.loads(json.dumps(schema)))


@pytest.mark.parametrize("cls", [Bound, Limit])
def test_interval_bounds_share_one_rule(cls: type[Limit]) -> None:
    # A phase's Bound is a served workload's Limit plus the engine count it applies to: one rule for both.
    with pytest.raises(ValueError, match="give min, max or both"):
        cls()
    with pytest.raises(ValueError, match="min 3 is above max 2"):
        cls(min=3, max=2)
    assert cls(max=2).model_dump() == {"min": None, "max": 2.0, **({"engines": None} if cls is Bound else {})}


def test_bound_saves_its_interval_before_its_engine_count() -> None:
    assert Bound(min=1, engines=4).model_dump_json() == '{"min":1.0,"max":null,"engines":4}'
