"""``opgraph replay``: the whole path on the CPU, resume, bad graphs and bad devices."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from replay_helpers import gemm_graph, tiny_graph
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import save_graph
from validators import load_results

FAST_ARGS = ["--warmup-ms", "0.5", "--min-samples", "3", "--max-samples", "5", "--max-time", "0.02"]


@pytest.fixture
def graphs(tmp_path: Path) -> tuple[Path, Path]:
    return save_graph(tiny_graph(), tmp_path / "tiny.json"), save_graph(gemm_graph(), tmp_path / "gemms.json.gz")


def test_replay_cpu_writes_jsonl_and_coverage(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "replay.jsonl"
    res = CliRunner().invoke(app, ["replay", str(graphs[0]), str(graphs[1]), "-o", str(out), *FAST_ARGS])
    assert res.exit_code == 0, res.output
    results = load_results(out)
    lines = out.read_text().splitlines()
    assert len(lines) == len(results) > 20
    assert all(json.loads(line)["device"] == "cpu" for line in lines)
    assert "coverage:" in res.output and "configs replayed" in res.output
    assert "unsupported" in res.output and "mylib.fancy_op.default" in res.output
    statuses = {r.status.value for r in results}
    assert statuses <= {"ok", "unsupported", "skipped"}


def test_resume_skips_done_configs(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    runner = CliRunner()
    first = runner.invoke(app, ["replay", str(graphs[1]), "-o", str(out), "--limit", "2", *FAST_ARGS])
    assert first.exit_code == 0, first.output
    assert len(load_results(out)) == 2
    again = runner.invoke(app, ["replay", str(graphs[1]), "-o", str(out), "--resume", *FAST_ARGS])
    assert again.exit_code == 0, again.output
    assert "1 replayed now, 2 from an earlier run" in again.output
    assert len(out.read_text().splitlines()) == 3
    fresh = runner.invoke(app, ["replay", str(graphs[1]), "-o", str(out), "--kinds", "gemm", *FAST_ARGS, "-q"])
    assert fresh.exit_code == 0 and len(out.read_text().splitlines()) == 3
    base = runner.invoke(app, ["replay", str(graphs[1]), "-o", str(tmp_path / "r2.jsonl"), "--baseline", str(out),
                               *FAST_ARGS, "-q"])  # fmt: skip
    assert base.exit_code == 0 and "run-to-run:" in base.output


def test_newer_schema_graph_is_reported_and_the_rest_runs(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    newer = tmp_path / "newer.json"
    data = json.loads(gzip.decompress(graphs[1].read_bytes()))
    data["schema_version"] = 99
    newer.write_text(json.dumps(data))
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["replay", str(newer), str(graphs[1]), "-o", str(out), *FAST_ARGS, "-q"])
    assert res.exit_code == 1
    assert "schema_version 99 is newer" in res.output and "skipped" in res.output
    assert len(load_results(out)) == 3
    only = CliRunner().invoke(app, ["replay", str(newer), "-o", str(out), *FAST_ARGS])
    assert only.exit_code == 2
    assert "error:" in only.output and "could be loaded" in only.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timer", "events"], "--timer: --timer events only applies to CUDA"),
        (["--min-samples", "50", "--max-samples", "10"], "--min-samples: 50 is more than --max-samples 10"),
        (["--min-samples", "0"], "--min-samples: 0 is out of range"),
        (["--max-samples", "0", "--min-samples", "0"], "--min-samples: 0 is out of range"),
        (["--limit", "0"], "--limit: 0 is out of range"),
        (["--limit", "-3"], "--limit: -3 is out of range"),
    ],
)
def test_options_that_would_be_ignored_are_one_line_errors(
    graphs: tuple[Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["replay", str(graphs[1]), "-o", str(out), *args])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not out.exists()


def test_baseline_without_a_common_config_says_so(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    base = tmp_path / "base.jsonl"
    res = CliRunner().invoke(app, ["replay", str(graphs[0]), "-o", str(base), "--kinds", "norm", *FAST_ARGS, "-q"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "r.jsonl"
    args = ["replay", str(graphs[1]), "-o", str(out), "--baseline", str(base), *FAST_ARGS, "-q"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    line = " ".join(res.output.split()).split("run-to-run: ")[1].split(" results:")[0]
    assert line == "no config timed in both runs: nothing to compare with the baseline"


@pytest.mark.parametrize("device", ["cuda:7", "warp-drive"])
def test_bad_device_is_one_line(graphs: tuple[Path, Path], tmp_path: Path, device: str) -> None:
    if device == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    res = CliRunner().invoke(app, ["replay", str(graphs[1]), "-o", str(tmp_path / "r.jsonl"), "--device", device])
    assert res.exit_code == 2
    assert res.output.startswith("error: --device:")
    assert "Traceback" not in res.output


def test_bad_options(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["replay", str(graphs[1]), "--kinds", "gemmm"])
    assert res.exit_code == 2 and "unknown op kind 'gemmm'" in res.output
    res = runner.invoke(app, ["replay", str(graphs[1]), "--recipe", "nonsense"])
    assert res.exit_code == 2 and "TARGET=RECIPE" in res.output


@pytest.mark.cuda
def test_replay_cuda_smoke(graphs: tuple[Path, Path], tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["replay", str(graphs[0]), "-o", str(out), "--device", "cuda", *FAST_ARGS])
    assert res.exit_code == 0, res.output
    results = load_results(out)
    assert all(r.status.value in ("ok", "unsupported", "skipped") for r in results)
    # The default CUDA timer sums the op's kernels as the profiler records them (--timer kernels).
    assert all(r.timing is None or r.timing.timer == "cuda_kernels" for r in results)
    assert any(r.timing is not None for r in results)
