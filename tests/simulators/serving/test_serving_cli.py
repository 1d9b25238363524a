"""``opgraph serve-sim`` end to end on a tiny model, and its one-line errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from opgraph.cli.app import app
from simulators.serving import ServingResult
from tests.conftest import TINY_LLAMA


def _serve(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["serve-sim", *map(str, args)])


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


def test_poisson_run_writes_result_perfetto_and_plot(config: Path, tmp_path: Path) -> None:
    out, trace, png = tmp_path / "r.json", tmp_path / "t.json.gz", tmp_path / "p.png"
    res = _serve(
        config,
        "--poisson",
        "100",
        "-n",
        "20",
        "--prompt-len",
        "4..30",
        "--output-len",
        "1..10",
        "--scheduler",
        "chunked",
        "--token-budget",
        "32",
        "--max-batch",
        "4",
        "-o",
        out,
        "--perfetto",
        trace,
        "--plot",
        png,
    )
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert result.summary.completed == 20 and result.settings.scheduler == "chunked"
    assert "TTFT" in res.output and "TPOT" in res.output and "end-to-end" in res.output
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("ph") == "X" and e.get("name") in ("prefill", "decode", "mixed")]
    assert len(steps) == result.summary.steps
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_request_whose_kv_cache_never_fits_is_a_listed_drop(config: Path, tmp_path: Path) -> None:
    from hardware import load_hardware

    # Tiny llama weights, counted by hand: embedding and lm_head 128x64 each, per layer q/o 64x64,
    # k/v 64x32, gate/up/down 64x96 and two norms of 64, a final norm: 78,144 bf16 parameters.
    weights = (2 * 128 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64) + 64) * 2
    per_token = 2 * 2 * 16 * 2 * 2  # layers x kv heads x head_dim x (K, V) x bf16
    memory = (weights + 20 * per_token) / 0.9 + 1  # room for 20 tokens at 90% utilisation
    spec = load_hardware("h100").model_copy(update={"memory_bytes": memory})
    hw = tmp_path / "small.json"
    hw.write_text(spec.model_dump_json())
    trace = tmp_path / "reqs.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,4\n0.001,16,10\n0.002,10,2\n")
    out = tmp_path / "r.json"
    res = _serve(config, "--requests", trace, "-H", hw, "-o", out)
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert result.settings.kv_capacity_tokens == 20
    assert [r.id for r in result.requests] == [0, 2]
    assert [d.id for d in result.dropped] == [1] and "26 tokens of KV cache" in result.dropped[0].reason
    assert "dropped request 1: needs 26 tokens" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--poisson", "1", "--requests", "x.jsonl"], "give either --requests TRACE or --poisson RATE"),
        ([], "give either --requests TRACE or --poisson RATE"),
        (["--poisson", "-2"], "--poisson: the arrival rate must be positive"),
        (["--poisson", "1", "--prompt-len", "0"], "--prompt-len: bad token length '0'"),
        (["--poisson", "1", "--scheduler", "fifo"], "--scheduler: unknown scheduler 'fifo'"),
        (["--poisson", "1", "--max-batch", "0"], "--max-batch: must be at least 1"),
        (["--poisson", "1", "--memory-utilisation", "1.5"], "--memory-utilisation: must be in (0, 1]"),
    ],
)
def test_bad_options_are_one_line_errors(config: Path, args: list[str], message: str) -> None:
    res = _serve(config, *args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], res.output


def test_bad_trace_is_a_one_line_error(config: Path, tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"arrival_s": -0.5, "prompt_tokens": 3, "output_tokens": 2}\n')
    res = _serve(config, "--requests", trace)
    assert res.exit_code == 2
    assert f"{trace}:1: arrival_s must be at least 0" in res.output
