"""Output files and exits: unwritable paths, outputs that are inputs, a closed stdout, wrong kinds of file.

Bad input is one line on stderr and exit 2, found before any long work.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_runner

from opgraph.cli import common
from opgraph.cli.app import app
from opgraph.ir import Edge, Gemm, GraphMetadata, Norm, OpGraph, Stage, save_graph

SCENARIO = '[[phases]]\ngraph = "g.json"\n'


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    ops = [Norm(id=0, rows=8, hidden=64, layer=0, stage=Stage.PREFILL)]
    ops += [Gemm(id=i, m=8, n=64, k=64, layer=0, stage=Stage.PREFILL) for i in (1, 2)]
    g = OpGraph(
        metadata=GraphMetadata(model="tiny", phase="prefill", capture={"batch": 1, "seq_len": 8}),
        ops=tuple(ops),
        edges=(Edge(src=0, dst=1), Edge(src=0, dst=2)),
    )
    return save_graph(g, tmp_path / "g.json")


@pytest.fixture
def timeline_file(graph_file: Path, tmp_path: Path) -> Path:
    out = tmp_path / "t.json"
    res = cli_runner().invoke(app, ["simulate", str(graph_file), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _commands(graph: Path, timeline: Path, bad: Path) -> dict[str, list[str]]:
    scenario = graph.with_name("s.scenario.toml")
    scenario.write_text(SCENARIO)
    return {
        "capture": ["capture", "vicuna-7b", "-o", str(bad)],
        "simulate": ["simulate", str(graph), "-o", str(bad)],
        "simulate --stats": ["simulate", str(graph), "--stats", str(bad)],
        "export": ["export", str(timeline), "-o", str(bad)],
        "import": ["import", str(timeline), "-o", str(bad)],
        "compare --html": ["compare", str(timeline), str(timeline), "--html", str(bad.with_suffix(".html"))],
        "compare --json": ["compare", str(timeline), str(timeline), "--json", str(bad)],
        "run -o": ["run", str(scenario), "-o", str(bad.parent / "out")],
        "analyze -o": ["analyze", str(timeline), "-o", str(bad)],
        "replay -o": ["replay", str(graph), "-o", str(bad.with_suffix(".jsonl"))],
    }


def _one_line_exit_2(res: object, *needles: str) -> None:
    assert res.exit_code == 2, res.output  # type: ignore[attr-defined]
    err = res.stderr  # type: ignore[attr-defined]
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    "command",
    ["capture", "simulate", "simulate --stats", "export", "import", "compare --html", "compare --json", "run -o",
     "analyze -o", "replay -o"],
)  # fmt: skip
def test_unwritable_output_is_one_line_exit_2(
    graph_file: Path, timeline_file: Path, tmp_path: Path, command: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = blocker / "x.json"  # its folder is a file: nobody can write there, root included
    res = cli_runner().invoke(app, _commands(graph_file, timeline_file, bad)[command])
    _one_line_exit_2(res, "a-file")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("command", ["capture", "simulate", "simulate --stats", "export", "import", "compare --html"])
def test_proc_is_refused_before_any_work(graph_file: Path, timeline_file: Path, command: str) -> None:
    res = cli_runner().invoke(app, _commands(graph_file, timeline_file, Path("/proc/x.json"))[command])
    _one_line_exit_2(res, "/proc")


def test_output_folder_for_a_file_is_refused(graph_file: Path, tmp_path: Path) -> None:
    res = cli_runner().invoke(app, ["simulate", str(graph_file), "-o", str(tmp_path)])
    _one_line_exit_2(res, "is a folder")


def test_run_into_an_existing_file_is_exit_2(graph_file: Path, tmp_path: Path) -> None:
    scenario = tmp_path / "s.scenario.toml"
    scenario.write_text(SCENARIO)
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    res = cli_runner().invoke(app, ["run", str(scenario), "-o", str(existing)])
    _one_line_exit_2(res, "is a file, not a folder")
    assert existing.read_text() == "keep me"


@pytest.mark.parametrize("flag", ["-o", "--stats"])
def test_simulate_refuses_to_overwrite_its_input(graph_file: Path, flag: str) -> None:
    before = graph_file.read_bytes()
    res = cli_runner().invoke(app, ["simulate", str(graph_file), flag, str(graph_file.parent / "." / graph_file.name)])
    _one_line_exit_2(res, "would be overwritten")
    assert graph_file.read_bytes() == before


def test_check_output_path_accepts_a_new_file_in_a_writable_folder(tmp_path: Path) -> None:
    common.check_output_path(tmp_path / "new.json", "-o")
    common.check_output_path(tmp_path / "new" / "x.json", "-o")  # missing folders are created when writing
    common.check_output_path(tmp_path / "a" / "b", "-o", folder=True)  # a run creates missing folders
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the probe left nothing behind


class _ClosedPipe:
    """A stdout whose reader went away (``| head`` after one line)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


def test_closed_stdout_is_a_quiet_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.console, "_file", _ClosedPipe())
    res = cli_runner().invoke(app, ["capture", "--list"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""


def test_compare_writes_its_files_before_a_closed_stdout(timeline_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    html, js = timeline_file.with_name("r.html"), timeline_file.with_name("r.json")
    monkeypatch.setattr(common.console, "_file", _ClosedPipe())
    res = cli_runner().invoke(
        app, ["compare", str(timeline_file), str(timeline_file), "--html", str(html), "--json", str(js)]
    )
    assert res.exit_code == 0, res.output
    assert html.is_file() and json.loads(js.read_text())


def test_pipe_into_head_exits_0_without_a_traceback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "opgraph", "capture", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ""


def test_engine_range_error_names_the_real_limit(graph_file: Path) -> None:
    res = cli_runner().invoke(app, ["simulate", str(graph_file), "-e", "1..100000"])
    _one_line_exit_2(res, "--engines", "1..4096")


def test_sweep_summary_names_the_engine_count_shown(graph_file: Path) -> None:
    res = cli_runner().invoke(app, ["simulate", str(graph_file), "-e", "1..8", "--host", "none"])
    assert res.exit_code == 0, res.output
    recommended = re.search(r"recommended: (\d+) engine\(s\)", res.stdout)
    header = re.search(r"tiny on \S+ .* engines (\d+)", res.stdout)
    assert recommended and header, res.stdout
    assert recommended.group(1) == header.group(1) != "1"
    compute_rows = re.findall(r"│ (compute\S*) ", res.stdout)
    assert len(compute_rows) == int(header.group(1))


def test_a_timeline_where_a_graph_is_expected(timeline_file: Path) -> None:
    res = cli_runner().invoke(app, ["simulate", str(timeline_file)])
    _one_line_exit_2(res, "is a timeline, not an OpGraph", "opgraph capture")


def test_a_graph_where_a_timeline_is_expected(graph_file: Path) -> None:
    res = cli_runner().invoke(app, ["export", str(graph_file), "-o", str(graph_file.with_name("x.json"))])
    _one_line_exit_2(res, "is an op graph (`opgraph capture`), not a Timeline")


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("r.jsonl", '{"key": "gemm", "status": "ok"}\n{"key": "norm", "status": "ok"}\n', "replay results"),
        ("s.scenario.toml", SCENARIO, "TOML file"),
        ("trace.json", '{"traceEvents": []}', "torch-profiler trace"),
    ],
)
def test_other_kinds_of_file_are_named(tmp_path: Path, name: str, content: str, said: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    res = cli_runner().invoke(app, ["info", str(path)])
    _one_line_exit_2(res, said, "not an OpGraph")


def test_no_browser_returns_at_once_with_the_url_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import webbrowser

    from opgraph.export import open_in_perfetto

    trace = tmp_path / "t.json"
    trace.write_text("{}")
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: False)  # what it returns with no browser
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines: list[str] = []
    assert open_in_perfetto(trace, port=port, timeout_s=600, notify=lines.append) is False
    assert str(trace) in lines[-1] and f"127.0.0.1:{port}/t.json" in lines[-1]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.parametrize(
    ("args", "second", "first"),
    [
        (["analyze", "TRACE", "--json-out", "OUT", "-o", "OUT"], "-o/--output", "--json-out"),
        (["capture", "llama-3.2-1b", "-o", "OUT", "--timeline", "OUT"], "--timeline", "-o/--output"),
        (["compare", "TRACE", "TRACE", "--json", "OUT", "--html", "OUT"], "--html", "--json"),
    ],
)
def test_two_outputs_on_one_file_say_so(tmp_path: Path, args: list[str], second: str, first: str) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    out = tmp_path / "same.json"
    argv = [str(trace) if a == "TRACE" else str(out) if a == "OUT" else a for a in args]
    res = cli_runner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert line.count("\n") == 0 and f"is also the {first} file" in line and second in line, line
    assert "input" not in line and not out.exists()
