"""``opgraph simulate`` options that must agree with each other and with ``--config``: a host time per op
with no host, the group flags over a config file, the statistics of every count of a sweep, the
one-line errors of ``--engines`` and ``--config``, ``--policy file.py:Class``, and the host note's
clause about ops without their own issue time."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import Result

from hardware.base import Cost
from hardware.models.roofline import RooflineModel
from hardware.spec import HardwareSpec
from opgraph.cli.app import app
from opgraph.ir import OpBase, OpKind, save_graph
from tests.conftest import cli_runner, one_error_line
from tests.opgraph.cli.test_simulate_export_options import _graph

POLICY_FILE = Path(__file__).resolve().parents[2] / "simulators" / "sim_policies.py"
"""A user's policy in a plain file (``LongestFirst``, named ``longest-first``), not an importable module."""


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    return save_graph(_graph(), tmp_path / "g.json")


def _run(*args: str | Path) -> Result:
    return cli_runner().invoke(app, ["simulate", *map(str, args)])


def _stats(*args: str | Path) -> dict[str, Any]:
    res = _run(*args, "--json")
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.stdout))


def _config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- --host none
NO_HOST = "us per op has no host to spend it: host mode none issues every op at time zero"
"""The one message every surface gives for a host time with host mode none (SimulationConfig's own)."""


def test_host_us_with_no_host_is_an_error(graph_file: Path) -> None:
    # HostMode.NONE is "no host cost: every op issued at time zero"; 50 us per op made the run host-bound.
    res = _run(graph_file, "--host", "none", "--host-us", "50")
    assert one_error_line(res) == (
        f"error: --host-us: 50 {NO_HOST} (drop --host-us, or give --host eager or --host cuda-graph with it)"
    )


def test_a_config_files_host_time_with_no_host_is_an_error_naming_the_field(graph_file: Path, tmp_path: Path) -> None:
    # The file alone is contradictory: SimulationConfig refuses it when read, naming the file and the field,
    # whatever the command line asks for (the file is no valid config, with or without --host eager).
    cfg = _config(tmp_path, {"host": {"mode": "none", "per_op_us": 5.0}})
    line = one_error_line(_run(graph_file, "--config", cfg))
    assert line.startswith(f"error: {cfg}: host.per_op_us: 5 {NO_HOST}")
    assert one_error_line(_run(graph_file, "--config", cfg, "--host", "eager")) == line
    # The file says no host, the command line gives a time: the error names both.
    line = one_error_line(_run(graph_file, "--config", _config(tmp_path, {"host": {"mode": "none"}}), "--host-us", "3"))
    assert line.startswith(f"error: --host-us with --config {cfg}: 3 {NO_HOST}")
    # A file host mode that the command line replaces: the flag's mode decides.
    eager = _config(tmp_path, {"host": {"mode": "eager"}})
    line = one_error_line(_run(graph_file, "--config", eager, "--host", "none", "--host-us", "3"))
    assert line.startswith(f"error: --host-us: 3 {NO_HOST}")


def test_the_python_api_refuses_a_host_time_with_no_host() -> None:
    # The rule lives in the config model: study_config, SimulationConfig and HostConfig refuse what the CLI does.
    from pydantic import ValidationError

    from opgraph.study import study_config
    from simulators import HostConfig, HostMode, SimulationConfig

    for build in (
        lambda: study_config(host_mode="none", host_us=30),
        lambda: SimulationConfig(host=HostConfig(mode=HostMode.NONE, per_op_us=30.0)),
        lambda: SimulationConfig.model_validate({"host": {"mode": "none", "per_op_us": 30}}),
        lambda: SimulationConfig.standard(2, host={"mode": "none", "per_op_us": 30}),
    ):
        with pytest.raises(ValidationError) as info:
            build()
        (error,) = info.value.errors()
        assert error["msg"] == f"30 {NO_HOST}" and error["loc"][-1] == "per_op_us"
    # 0 agrees with no host, and a host mode given without a time drops the base's time (no host, no host time).
    assert study_config(host_mode="none", host_us=0).host.per_op_us == 0.0
    base = SimulationConfig(host=HostConfig(mode=HostMode.EAGER, per_op_us=50.0))
    assert study_config(base=base, host_mode="none").host.per_op_us is None
    assert study_config(base=base, host_mode="cuda_graph").host.per_op_us == 50.0


def test_no_host_has_no_host_time(graph_file: Path, tmp_path: Path) -> None:
    plain = _stats(graph_file, "--host", "none")
    assert (plain["host"]["per_op_us"], plain["host"]["busy_us"], plain["host"]["host_bound_us"]) == (0.0, 0.0, 0.0)
    assert _stats(graph_file, "--host", "none", "--host-us", "0")["makespan_us"] == plain["makespan_us"]
    # --host none over a file that gives an eager host time: the flag wins, and no host means no host time.
    cfg = _config(tmp_path, {"host": {"mode": "eager", "per_op_us": 50.0}})
    over = _stats(graph_file, "--config", cfg, "--host", "none")
    assert (over["config"]["host_mode"], over["host"]["busy_us"]) == ("none", 0.0)
    assert over["makespan_us"] == pytest.approx(plain["makespan_us"])


# ---------------------------------------------------------------- flags over --config
CONFIG = {
    "groups": [{"name": "compute", "count": 2}, {"name": "copy", "role": "copy", "count": 3}],
    "host": {"mode": "cuda_graph", "per_op_us": 7.0, "framework": False, "sync_each_step": False, "record": False},
    "policy": "critical-path",
    "tp": 2,
    "jitter": 0.5,
    "seed": 3,
}
"""A config file with settings away from the flags' values below (``--skip-uncosted`` and
``--independent-engines`` have no off form: the file leaves them off)."""

FLAG_OVER_CONFIG: dict[str, tuple[tuple[str, ...], Any]] = {
    # option name: (the flag at a value other than the file's, what the run's config then says)
    "engines": (("-e", "1"), ("engines.compute", 1)),
    "copy_engines": (("--copy-engines", "1"), ("engines.copy", 1)),
    "links": (("--links", "4"), ("engines.link", 4)),
    "policy": (("--policy", "earliest"), ("policy", "earliest")),
    "tp": (("--tp", "1"), ("tp", 1)),
    "host": (("--host", "eager"), ("host_mode", "eager")),
    "host_us": (("--host-us", "2"), ("host_per_op_us", 2.0)),
    "jitter": (("--jitter", "0"), ("jitter", 0.0)),
    "seed": (("--seed", "0"), ("seed", 0)),
    "skip_uncosted": (("--skip-uncosted",), ("skip_uncosted", True)),
    "independent_engines": (("--independent-engines",), ("independent_engines", True)),
}
"""Flags whose effect the run's ``config`` (its provenance) shows."""

NOT_IN_CONFIG = {
    "graph_path", "hardware", "cost_model", "cost_option", "no_shard", "expert_parallel", "collective_fit",
    "config_path", "tolerance", "output", "stats_path", "as_json", "open_trace",
}  # fmt: skip
"""Options a SimulationConfig has no setting for."""

SEEN_ELSEWHERE = {"no_sync", "framework_time", "no_host_track"}
"""Flags over the file whose effect shows in the statistics or the timeline (tested below)."""


def test_every_simulate_option_is_checked_against_config() -> None:
    # A new option must say how it meets --config: a test below, or no setting in the file at all.
    command = typer.main.get_command(app).commands["simulate"]  # type: ignore[attr-defined]
    names = {p.name for p in command.params}
    assert names == set(FLAG_OVER_CONFIG) | NOT_IN_CONFIG | SEEN_ELSEWHERE


@pytest.mark.parametrize("option", sorted(FLAG_OVER_CONFIG))
def test_a_flag_given_wins_over_the_config_file(graph_file: Path, tmp_path: Path, option: str) -> None:
    args, (key, want) = FLAG_OVER_CONFIG[option]
    cfg = _config(tmp_path, CONFIG)
    before = _stats(graph_file, "--config", cfg, "--no-shard")["config"]
    assert before.get(key) != want  # the file says otherwise
    after = _stats(graph_file, "--config", cfg, "--no-shard", *args)["config"]
    assert after.get(key) == want
    # Only that setting changed: the file's others stand.
    assert {k: v for k, v in after.items() if k != key} == {k: v for k, v in before.items() if k != key}


def test_copy_engines_zero_removes_the_files_copy_group(graph_file: Path, tmp_path: Path) -> None:
    c = _stats(graph_file, "--config", _config(tmp_path, CONFIG), "--no-shard", "--copy-engines", "0")["config"]
    assert "engines.copy" not in c and c["engines.compute"] == 2


def test_copy_engines_over_a_file_without_copy_group_adds_one(graph_file: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"groups": [{"name": "compute", "count": 2}]})
    assert "engines.copy" not in _stats(graph_file, "--config", cfg)["config"]
    assert _stats(graph_file, "--config", cfg, "--copy-engines", "2")["config"]["engines.copy"] == 2


def test_copy_engines_over_several_copy_groups_is_an_error(graph_file: Path, tmp_path: Path) -> None:
    # Two copy groups cannot both take MEMORY: the second takes another kind.
    groups = [
        {"name": "compute"},
        {"name": "h2d", "role": "copy"},
        {"name": "d2h", "role": "copy", "kinds": ["embedding"]},
    ]
    cfg = _config(tmp_path, {"groups": groups})
    line = one_error_line(_run(graph_file, "--config", cfg, "--copy-engines", "2"))
    assert line.startswith(f"error: --copy-engines with --config {cfg}: the config has 2 copy groups")


def test_host_flags_win_over_the_config_file(graph_file: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"host": {"framework": False, "sync_each_step": False, "record": False}})
    # --framework-time turns the file's framework time back on (it was silently ignored).
    off = _stats(graph_file, "--config", cfg)
    on = _stats(graph_file, "--config", cfg, "--framework-time")
    assert not any("of framework time between ops" in n for n in off["notes"])
    assert any("of framework time between ops" in n for n in on["notes"])
    assert on["host"]["busy_us"] > off["host"]["busy_us"]
    # The host track: the file leaves it out; --no-host-track given as a flag cannot turn it on, and
    # the file's setting stands without it.
    out = tmp_path / "t.json"
    res = _run(graph_file, "--config", cfg, "-o", out)
    assert res.exit_code == 0, res.output
    assert "host" not in {s["track"] for s in json.loads(out.read_text())["spans"]}


def _help(option: str) -> str:
    command = typer.main.get_command(app).commands["simulate"]  # type: ignore[attr-defined]
    return str(next(p.help for p in command.params if p.name == option))


def test_the_help_says_how_flags_meet_config_and_what_stats_holds() -> None:
    assert "replaces" not in _help("config_path")
    assert "--copy-engines/--links its copy and link groups'" in _help("config_path")
    assert 'every engine count\'s statistics under "runs"' in _help("stats_path")
    assert "not with --host none" in _help("host_us")


# ---------------------------------------------------------------- --stats of a sweep
def test_a_sweeps_stats_file_holds_every_engine_count(graph_file: Path, tmp_path: Path) -> None:
    stats = tmp_path / "s.json"
    printed = _stats(graph_file, "-e", "1..3", "--stats", stats)
    written = json.loads(stats.read_text())
    assert sorted(written["runs"]) == ["1", "2", "3"]
    for n, run in written["runs"].items():
        assert run["config"]["engines.compute"] == int(n)
        point = next(p for p in written["sweep"]["points"] if p["engines"] == int(n))
        assert run["makespan_us"] == pytest.approx(point["makespan_us"])
    # The rest is what --json prints: the sweep and the recommended count's statistics.
    assert {k: v for k, v in written.items() if k != "runs"} == printed
    assert written["runs"][str(written["sweep"]["recommended"])] == written["recommended"]
    res = _run(graph_file, "-e", "1..3", "--stats", stats)
    assert f"statistics (every engine count of the sweep: 1, 2, 3): {stats}" in res.stdout


def test_one_runs_stats_file_is_its_statistics(graph_file: Path, tmp_path: Path) -> None:
    stats = tmp_path / "s.json"
    printed = _stats(graph_file, "-e", "2", "--stats", stats)
    assert json.loads(stats.read_text()) == printed


# ---------------------------------------------------------------- one-line errors
@pytest.mark.parametrize(
    ("engines", "says"),
    [
        ("1..100000", "--engines: the range 1..100000 goes above 4096, the largest engine count allowed"),
        ("0..4", "--engines: the range 0..4 starts below 1, the smallest engine count allowed"),
        ("1,5000", "--engines: engine count 5000 in '1,5000' is out of range (each count must be 1..4096)"),
        ("1,2,,4", "--engines: '1,2,,4' has an empty item"),
        ("1,2,", "--engines: '1,2,' has an empty item"),
        ("1..80", "--engines: a sweep of 80 counts (1..80) is too long (give at most 64 counts"),
    ],
)
def test_bad_engine_counts_are_one_line(graph_file: Path, engines: str, says: str) -> None:
    assert one_error_line(_run(graph_file, "-e", engines)).startswith(f"error: {says}")


def test_a_huge_range_is_refused_before_it_is_expanded(graph_file: Path) -> None:
    start = time.perf_counter()
    line = one_error_line(_run(graph_file, "-e", f"1..{10**15}"))
    assert "goes above 4096" in line and time.perf_counter() - start < 5


@pytest.mark.parametrize(("option", "value"), [("--tp", "2000"), ("--copy-engines", "5000"), ("--links", "0")])
def test_group_and_tp_counts_out_of_range_are_one_line(graph_file: Path, option: str, value: str) -> None:
    assert one_error_line(_run(graph_file, option, value)).startswith(f"error: {option}: {value} is out of range")


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        ([], "groups: Value error, no engine group given: give at least the catch-all compute group"),
        (
            [{"name": "a"}, {"name": "b"}],
            "groups: Value error, exactly one compute group must have no kinds (it takes every unclaimed kind); "
            "these have none: 'a' (compute), 'b' (compute)",
        ),
    ],
)
def test_bad_config_groups_name_the_field(graph_file: Path, tmp_path: Path, groups: list[Any], says: str) -> None:
    cfg = _config(tmp_path, {"groups": groups})
    assert one_error_line(_run(graph_file, "--config", cfg)).startswith(f"error: {cfg}: {says}")


# ---------------------------------------------------------------- --policy file.py:Class
def test_policy_from_a_python_file(graph_file: Path) -> None:
    res = _run(graph_file, "-p", f"{POLICY_FILE}:LongestFirst")
    assert res.exit_code == 0, res.output
    assert "policy longest-first" in res.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("missing.py:Mine", "no such Python file"),
        (f"{POLICY_FILE}:Nope", "has no attribute 'Nope'"),
        ("bogus", "unknown scheduling policy 'bogus'"),
    ],
)
def test_a_policy_that_cannot_be_found_is_one_line_naming_the_option(graph_file: Path, spec: str, says: str) -> None:
    line = one_error_line(_run(graph_file, "-p", spec))
    assert line.startswith("error: --policy: ") and says in line


def test_a_config_files_policy_that_cannot_be_found_names_the_file(graph_file: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"policy": "bogus"})
    assert one_error_line(_run(graph_file, "--config", cfg)).startswith(f"error: {cfg}: policy: unknown scheduling")


# ---------------------------------------------------------------- the host note
class GemmIssueTimes(RooflineModel):
    """The roofline with a measured issue time for GEMMs only: the other ops take the per-op default."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        return dataclasses.replace(super().estimate(op, hw), host_s=2e-6 if op.kind is OpKind.GEMM else None)


def test_the_host_note_names_the_others_only_when_there_are_some(graph_file: Path) -> None:
    notes = _stats(graph_file, "--no-framework-time")["notes"]
    every = next(n for n in notes if n.startswith("host: 3 of 3 ops take their eager issue time"))
    assert "other" not in every
    part = _stats(graph_file, "-c", f"{__file__}:GemmIssueTimes", "--no-framework-time")
    note = next(n for n in part["notes"] if n.startswith("host: 2 of 3 ops take their eager issue time"))
    per_op = part["host"]["per_op_us"]
    assert f", the other 1 op(s) {per_op:g} us each;" in note
    assert part["host"]["busy_us"] == pytest.approx(2 * 2.0 + per_op)
