"""CLI output does not depend on the terminal: no wrapping, folding or ``…`` when output is not one.

Each test runs the CLI in-process under several ``COLUMNS`` values, with a forced terminal, and
with long names (a long CPU name, a long model name), and checks that whole lines come out whole.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.cli.common import CliConsole, cli_notes, new_table
from opgraph.ir import Edge, Gemm, GraphMetadata, Norm, OpGraph, Stage, save_graph

WIDTHS = ["40", "80", "300"]
LONG_CPU = "Intel(R) Xeon(R) Platinum 8480+ Processor @ 2.00GHz with a very long marketing name indeed"
LONG_MODEL = "an-organisation-with-a-long-name/a-model-whose-name-goes-on-and-on-past-any-terminal-width-v1.5"

ENVS = [{"COLUMNS": w} for w in WIDTHS] + [
    {"COLUMNS": "40", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"},  # rich told the output is a terminal
    {"COLUMNS": "40", "FORCE_COLOR": "1"},
]
ENV_IDS = [f"COLUMNS={w}" for w in WIDTHS] + ["forced-tty", "force-color"]


def _runner(env: dict[str, str]) -> CliRunner:
    return CliRunner(env={"TERM": "xterm-256color", **env})


def _plain(text: str) -> str:
    """``text`` without ANSI escapes (FORCE_COLOR adds them)."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _graph(tmp_path: Path, model: str = "tiny") -> Path:
    g = OpGraph(
        metadata=GraphMetadata(model=model, phase="prefill", capture={"batch": 1, "seq_len": 8}),
        ops=(
            Norm(id=0, rows=8, hidden=64, layer=0, stage=Stage.PREFILL),
            Gemm(id=1, m=8, n=64, k=64, layer=0, stage=Stage.PREFILL),
        ),
        edges=(Edge(src=0, dst=1),),
    )
    return save_graph(g, tmp_path / "g.json")


@pytest.mark.parametrize("env", ENVS, ids=ENV_IDS)
def test_preset_list_is_whole_at_any_width(env: dict[str, str]) -> None:
    from opgraph.capture.sources import presets

    res = _runner(env).invoke(app, ["capture", "--list"])
    assert res.exit_code == 0, res.output
    out = _plain(res.output)
    assert "…" not in out
    for p in presets().values():
        rows = [line for line in out.splitlines() if f" {p.name} " in line]
        assert len(rows) == 1 and p.hf_id in rows[0] and p.architecture in rows[0], p.name
    assert "MODEL may also be a config.json, a model folder, or a hub id in the local Hugging Face cache." in out


@pytest.mark.parametrize("env", ENVS, ids=ENV_IDS)
def test_long_model_name_stays_on_its_line(tmp_path: Path, env: dict[str, str]) -> None:
    res = _runner(env).invoke(app, ["simulate", str(_graph(tmp_path, LONG_MODEL)), "-H", "h100"])
    assert res.exit_code == 0, res.output
    header = [line for line in _plain(res.output).splitlines() if line.startswith(LONG_MODEL)]
    assert len(header) == 1 and "policy earliest" in header[0] and "engines 1" in header[0]


@pytest.mark.parametrize("env", ENVS[:3], ids=ENV_IDS[:3])
def test_replay_summary_line_with_a_long_cpu_name(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import validators.replay

    monkeypatch.setattr(validators.replay, "device_name", lambda dev: LONG_CPU)
    out = tmp_path / "r.jsonl"
    args = ["--warmup-ms", "0.5", "--min-samples", "3", "--max-samples", "3", "--max-time", "0.01", "--no-check"]
    res = _runner(env).invoke(app, ["replay", str(_graph(tmp_path)), "-o", str(out), *args])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("device: ")]
    assert len(lines) == 1 and lines[0].startswith(f"device: {LONG_CPU} (cpu); ") and "replayed now" in lines[0]


def test_analyze_verbose_keeps_kernel_names(traces_dir: Path) -> None:
    import json

    trace = traces_dir / "TraceLens__vllm_decode_full__graph_execution.json.gz"
    data = json.loads(CliRunner().invoke(app, ["analyze", str(trace), "--json"]).output)
    names = [k["short_name"] for k in data["unique_kernels"]][:5]
    assert names and max(len(n) for n in names) > 30  # long enough to be cut in a 40-column table
    res = _runner({"COLUMNS": "40"}).invoke(app, ["analyze", str(trace), "-v", "--top", "5"])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    for name in names:
        assert name in res.output
    assert "python=True" not in res.output


def test_a_real_terminal_folds_long_cells_instead_of_cropping() -> None:
    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = FakeTty()
    console = CliConsole(file=stream, width=40, color_system=None)
    table = new_table("name", "value")
    table.add_row(LONG_MODEL, "1")
    console.print(table)
    text = stream.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 40
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") == 3)
    assert LONG_MODEL in cells


def test_not_a_terminal_ignores_the_width_rich_was_given() -> None:
    stream = io.StringIO()
    console = CliConsole(file=stream, width=40, color_system=None)
    console.print("word " * 40)
    assert stream.getvalue().strip() == ("word " * 40).strip()


@pytest.mark.parametrize("env", [{"LC_ALL": "C", "COLUMNS": "40"}, {"LC_ALL": "C.UTF-8", "COLUMNS": "300"}])
def test_piped_output_under_the_c_locale(env: dict[str, str]) -> None:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop("LANG", None)
    res = subprocess.run(
        [sys.executable, "-m", "opgraph", "capture", "--list"], capture_output=True, env=full, cwd=REPO, timeout=300
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode("utf-8")
    assert "deepseek-r1-distill-qwen-32b" in out and "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B" in out
    assert "…" not in out


def test_cli_notes_do_not_name_library_keywords() -> None:
    library = (
        "12 python_function events not imported "
        "(the Python API's opgraph.trace.load_trace_data(path, python=True) keeps them)"
    )
    notes = cli_notes([library, "other"])
    assert notes == ("12 python_function events not imported (the CLI leaves Python stack events out)", "other")


def _tty_render(table: object, width: int) -> list[str]:
    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = FakeTty()
    CliConsole(file=stream, width=width, color_system=None).print(table)
    return stream.getvalue().splitlines()


NUMBERS = ["12,687.9", "+523.6%", "683.95 us", "-0.4%"]


def _numbers_table() -> object:
    table = new_table("stage", "kind", "predicted", "measured", "error", title="by kind")
    for col in table.columns[2:]:
        col.justify = "right"
    table.add_row("decode", "activation", NUMBERS[0], NUMBERS[2], NUMBERS[1])
    table.add_row("", "elementwise", "5.69 us", "5.25 us", NUMBERS[3])
    return table


@pytest.mark.parametrize("width", [40, 44, 60])
def test_a_narrow_terminal_never_splits_a_number(width: int) -> None:
    lines = _tty_render(_numbers_table(), width)
    assert max(len(line) for line in lines) <= width
    for number in [*NUMBERS, "5.69 us", "activation", "elementwise"]:
        assert any(number in line for line in lines), (number, lines)


def test_a_table_too_wide_for_its_numbers_becomes_records() -> None:
    table = new_table(*(f"column {i}" for i in range(7)), title="wide")
    for col in table.columns:
        col.justify = "right"
    table.add_row(*(f"{i},{i}00,000.5 ms" for i in range(7)))
    table.add_row("", *(f"{i}.25 us" for i in range(1, 7)))
    lines = _tty_render(table, 40)
    assert lines[0].strip() == "wide"
    assert max(len(line) for line in lines) <= 40
    # One line per cell, whole; the second row continues the first's group (its first cell is empty).
    for i in range(1, 7):
        assert sum(line.split() == ["column", str(i), f"{i},{i}00,000.5", "ms"] for line in lines) == 1
    assert sum(line.split() == ["column", "0", "0,000,000.5", "ms"] for line in lines) == 2
    second = lines[lines.index("") + 1 :]
    assert second[0].split() == ["column", "0", "0,000,000.5", "ms"]
    assert [line.split()[-2] for line in second[1:]] == [f"{i}.25" for i in range(1, 7)]


def test_notes_are_printed_as_text_not_markup(tmp_path: Path) -> None:
    """A note quotes names (kernels, scopes, files) whose brackets rich would take for markup and drop:
    every command prints its notes through one helper that prints them as they are."""
    toml = (REPO / "hardware" / "catalog" / "h100-pcie.toml").read_text()
    toml = toml.replace(
        '"launch latency and host overheads are typical values; calibrate them"', '"see [bold]x[/bold] and [docs]"'
    )
    path = tmp_path / "dev.toml"
    path.write_text(toml)
    res = _runner({"COLUMNS": "300"}).invoke(app, ["hardware", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert "note: see [bold]x[/bold] and [docs]" in res.output
