"""Options that must take effect as given, and bad input refused on one line before any output:
``simulate --host-us`` with a cost model that knows per-op issue times, ``simulate --config`` settings
the command line leaves alone, a graph of no ops, ``verify --expect`` of a binary file, ``export``
with another model's graph or a bad ``--port``/``--timeout``, two outputs on one file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from opgraph.cli.app import app
from opgraph.ir import Edge, Gemm, GraphMetadata, Norm, OpGraph, Stage, save_graph
from tests.conftest import cli_runner, one_error_line


def _graph(model: str = "tiny") -> OpGraph:
    ops = [Norm(id=0, rows=8, hidden=64, layer=0, stage=Stage.PREFILL)]
    ops += [Gemm(id=i, m=8, n=64, k=64, layer=0, stage=Stage.PREFILL) for i in (1, 2)]
    return OpGraph(
        metadata=GraphMetadata(model=model, phase="prefill", capture={"batch": 1, "seq_len": 8}),
        ops=tuple(ops),
        edges=(Edge(src=0, dst=1), Edge(src=0, dst=2)),
    )


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    return save_graph(_graph(), tmp_path / "g.json")


def _run(*args: str | Path) -> Result:
    return cli_runner().invoke(app, [*map(str, args)])


def _stats(*args: str | Path) -> dict[str, Any]:
    res = _run("simulate", *args, "--json")
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.stdout))


# ---------------------------------------------------------------- simulate --host-us
@pytest.mark.parametrize("host_us", [1.0, 500.0])
def test_host_us_given_is_every_ops_issue_time_with_the_default_cost_model(graph_file: Path, host_us: float) -> None:
    # The default H100 model (its measured profile) knows an issue time per aten call; a time the user
    # gives wins over it: three ops issued one after another take 3 x host_us of host time.
    st = _stats(graph_file, "--host-us", host_us, "--no-framework-time")
    assert st["host"]["per_op_us"] == host_us
    assert st["host"]["busy_us"] == pytest.approx(3 * host_us)
    assert not any("from the cost model" in n for n in st["notes"])


def test_without_host_us_the_cost_models_issue_times_are_used_and_said(graph_file: Path) -> None:
    st = _stats(graph_file, "--no-framework-time")
    assert any(n.startswith("host: 3 of 3 ops take their eager issue time from the cost model") for n in st["notes"])
    assert st["host"]["busy_us"] != pytest.approx(3 * st["host"]["per_op_us"])


def _host_line(*args: str | Path) -> str:
    res = _run("simulate", *args)
    assert res.exit_code == 0, res.output
    return next(ln for ln in res.stdout.splitlines() if ln.startswith("host "))


def test_the_summarys_host_line_says_what_the_host_model_really_is(graph_file: Path) -> None:
    # Every op takes its issue time from the profile: the line says so, not "host eager 10.07 us/op".
    line = _host_line(graph_file, "--no-framework-time")
    assert line.startswith("host eager: per-op issue times from ProfileModel (3 of 3 ops, median ")
    assert "us/op" not in line.split(":")[1]
    with_framework = _host_line(graph_file)
    assert "us/op on average with framework time between ops" in with_framework
    # One time for every op: the plain form.
    assert _host_line(graph_file, "--host-us", "5", "--no-framework-time").startswith("host eager 5 us/op: issued")
    assert _host_line(graph_file, "-c", "roofline", "--no-framework-time").startswith("host eager 8 us/op: issued")


# ---------------------------------------------------------------- simulate --config
def _config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    return path


def test_config_file_settings_stand_unless_the_command_line_gives_the_flag(graph_file: Path, tmp_path: Path) -> None:
    data = {
        "groups": [{"name": "compute", "count": 2}, {"name": "copy", "role": "copy"}],
        "host": {"mode": "none"},
        "policy": "critical-path",
        "jitter": 0.5,
        "seed": 3,
        "skip_uncosted": True,
    }
    cfg = _config(tmp_path, data)
    st = _stats(graph_file, "--config", cfg)
    c = st["config"]
    assert (c["policy"], c["jitter"], c["seed"], c["skip_uncosted"]) == ("critical-path", 0.5, 3, True)
    assert (c["host_mode"], st["host"]["mode"], c["engines.compute"]) == ("none", "none", 2)
    # A flag on the command line, even at its default value, overrides the file.
    c = _stats(graph_file, "--config", cfg, "--policy", "earliest", "--host", "eager", "--seed", "0")["config"]
    assert (c["policy"], c["host_mode"], c["seed"], c["jitter"]) == ("earliest", "eager", 0, 0.5)


def test_config_file_host_time_per_op_is_the_users_statement(graph_file: Path, tmp_path: Path) -> None:
    st = _stats(graph_file, "--config", _config(tmp_path, {"host": {"per_op_us": 7.0}}), "--no-framework-time")
    assert st["host"]["per_op_us"] == 7.0 and st["host"]["busy_us"] == pytest.approx(3 * 7.0)


def test_config_file_tp_shards_the_graph(graph_file: Path, tmp_path: Path) -> None:
    res = _run("simulate", graph_file, "--config", _config(tmp_path, {"tp": 2}))
    assert res.exit_code == 0, res.output
    assert "tp 2" in res.stdout.splitlines()[0]


# ---------------------------------------------------------------- a graph of no ops
def test_a_graph_of_no_ops_simulates_to_zero_with_the_default_host(tmp_path: Path) -> None:
    empty = save_graph(_graph().model_copy(update={"ops": (), "edges": ()}), tmp_path / "empty.json")
    st = _stats(empty)  # eager host, the shipped host profile's in-context terms
    assert st["makespan_us"] == 0.0


# ---------------------------------------------------------------- verify --expect of a binary file
def test_verify_expect_of_a_binary_file_is_one_line(graph_file: Path, tmp_path: Path) -> None:
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    res = _run("verify", graph_file, "--expect", binary)
    assert "not a text file" in one_error_line(res) and "bin.toml" in res.stderr


# ---------------------------------------------------------------- export
@pytest.fixture
def timeline_file(graph_file: Path, tmp_path: Path) -> Path:
    out = tmp_path / "t.json"
    res = _run("simulate", graph_file, "-o", out)
    assert res.exit_code == 0, res.output
    return out


def test_export_with_another_models_graph_is_refused(timeline_file: Path, tmp_path: Path) -> None:
    other = save_graph(_graph("other-model"), tmp_path / "other.json")
    out = tmp_path / "x.json"
    res = _run("export", timeline_file, "-g", other, "-o", out)
    line = one_error_line(res)
    assert "'tiny'" in line and "'other-model'" in line and str(timeline_file) in line
    assert not out.exists()
    same = _run("export", timeline_file, "-g", timeline_file.with_name("g.json"), "-o", out)
    assert same.exit_code == 0, same.output


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--port", "99999", "--port"), ("--port", "0", "--port"), ("--timeout", "-1", "--timeout")],
)
def test_export_bad_open_options_are_refused_before_writing(
    timeline_file: Path, tmp_path: Path, flag: str, value: str, needle: str
) -> None:
    out = tmp_path / "x.json"
    res = _run("export", timeline_file, "-o", out, "--open", flag, value)
    assert one_error_line(res).startswith(f"error: {needle}")
    assert not out.exists()


def test_simulate_output_and_stats_on_one_file_say_it_is_another_output(graph_file: Path, tmp_path: Path) -> None:
    same = tmp_path / "s.json"
    res = _run("simulate", graph_file, "-o", same, "--stats", same)
    line = one_error_line(res)
    assert "also the -o/--output file" in line and "input" not in line
    assert not same.exists()
