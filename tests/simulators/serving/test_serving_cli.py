"""``opgraph serve-sim`` end to end on a tiny model, and its one-line errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from opgraph.cli.app import app
from opgraph.ir import load_model
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
    assert json.loads(out.read_text())["schema_version"] == 1
    result = load_model(out, ServingResult)  # checks the version as every saved file's loader does
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


@pytest.mark.parametrize(
    "content", [gzip.compress(b'{"ops": []}', mtime=0), b"\x89PNG\r\n\x1a\n\x00\xff\xfe"], ids=["gzip", "png"]
)
def test_a_binary_request_trace_is_a_one_line_error(config: Path, tmp_path: Path, content: bytes) -> None:
    trace = tmp_path / "graph.json.gz"
    trace.write_bytes(content)
    res = _serve(config, "--requests", trace)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{trace}: not a text file" in lines[0] and "internal error" not in res.output


def test_a_plot_path_of_no_image_format_is_refused_before_the_run(config: Path, tmp_path: Path) -> None:
    out, plot = tmp_path / "s.json", tmp_path / "p.txt"
    res = _serve(config, "--poisson", "1", "-n", "2", "-o", out, "--plot", plot)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: --plot:") and "'txt'" in lines[0]
    assert not out.exists() and not plot.exists()  # refused before anything was simulated or written


def test_outputs_on_one_file_are_refused_as_outputs(config: Path, tmp_path: Path) -> None:
    same = tmp_path / "s.json"
    res = _serve(config, "--poisson", "1", "-n", "2", "-o", same, "--perfetto", same)
    assert res.exit_code == 2 and "also the -o/--output file" in res.output and "input" not in res.output


def test_prompts_beyond_the_context_window_are_an_error_or_listed_drops(config: Path, tmp_path: Path) -> None:
    # TINY_LLAMA has 64 positions: a Poisson workload of 60-token prompts and 8-token outputs cannot fit.
    res = _serve(config, "--poisson", "5", "-n", "3", "--prompt-len", "60", "--output-len", "8")
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: --prompt-len:") and "context window of 64 positions" in lines[0]
    # A trace: the request that does not fit is dropped and named, the others are served.
    trace = tmp_path / "reqs.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,4\n0.001,60,8\n")
    out = tmp_path / "r.json"
    res = _serve(config, "--requests", trace, "-o", out)
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert [r.id for r in result.requests] == [0] and [d.id for d in result.dropped] == [1]
    assert "68 positions" in result.dropped[0].reason and "context window (64)" in result.dropped[0].reason


@pytest.mark.parametrize(
    ("arrival", "message"),
    [("1e308", "arrival_s must be at most 1e+09"), ("Infinity", "must be a finite number"), ("NaN", "finite number")],
)
def test_arrival_times_must_be_finite_and_sane(config: Path, tmp_path: Path, arrival: str, message: str) -> None:
    trace = tmp_path / "t.jsonl"
    good = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}'
    trace.write_text(f'{good}\n{{"arrival_s": {arrival}, "prompt_tokens": 5, "output_tokens": 2}}\n')
    res = _serve(config, "--requests", trace)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{trace}:2: " in lines[0] and message in lines[0]


def test_a_poisson_rate_that_runs_past_the_latest_arrival_is_refused(config: Path) -> None:
    res = _serve(config, "--poisson", "1e-300", "-n", "3")
    assert res.exit_code == 2 and "--poisson: 3 arrivals at 1e-300/s run past" in res.output


@pytest.mark.parametrize(
    ("hardware", "cost_model", "uncalibrated"),
    [("h100", "profile", False), ("a100-80gb", "roofline", True), ("h100", "roofline", False)],
)
def test_the_cost_model_defaults_as_simulate_chooses_it(
    config: Path, tmp_path: Path, hardware: str, cost_model: str, uncalibrated: bool
) -> None:
    """Without -c, a device that ships a profile predicts from it and one that does not says it is
    uncalibrated; a named -c wins (the last case)."""
    out = tmp_path / "r.json"
    named = ["-c", cost_model] if (hardware, cost_model) == ("h100", "roofline") else []
    res = _serve(
        config,
        "-H",
        hardware,
        *named,
        "--poisson",
        "50",
        "-n",
        "5",
        "--prompt-len",
        "16",
        "--output-len",
        "4",
        "-o",
        out,
    )
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert result.settings.cost_model == cost_model
    assert f"cost model {cost_model}" in " ".join(res.output.split())
    assert any("is uncalibrated" in n for n in result.notes) is uncalibrated


# ---------------------------------------------------------------- --host and --host-us
def test_a_host_time_with_no_host_is_refused_as_simulate_refuses_it(config: Path, tmp_path: Path) -> None:
    # HostMode.NONE issues every op at time zero: a host time per op with it is a contradiction, refused
    # before any capture with simulate's own error line (one check serves both commands).
    from opgraph.ir import save_graph
    from tests.conftest import cli_runner, one_error_line
    from tests.opgraph.cli.test_simulate_export_options import _graph

    flags = ["--host", "none", "--host-us", "30"]
    serve = one_error_line(cli_runner().invoke(app, ["serve-sim", str(config), "--poisson", "1", "-n", "2", *flags]))
    graph = save_graph(_graph(), tmp_path / "g.json")
    simulate = one_error_line(cli_runner().invoke(app, ["simulate", str(graph), *flags]))
    assert serve == simulate
    assert serve.startswith("error: --host-us: 30 us per op has no host to spend it: host mode none issues every op")
    res = cli_runner().invoke(app, ["serve-sim", str(config), "--poisson", "1", "-n", "2", "--host-us", "-1"])
    assert one_error_line(res) == "error: --host-us: -1.0 is negative"


def test_the_host_time_per_op_prices_every_step(config: Path, tmp_path: Path) -> None:
    # An eager host that spends 200 us on each op makes every step host-bound: each step of the tiny
    # model (dozens of ops of a few us) takes longer than at 0 us, and --host none with 0 us agrees.
    def steps(*flags: str) -> list[float]:
        out = tmp_path / "r.json"
        res = _serve(config, "--requests", trace, "-o", out, *flags)
        assert res.exit_code == 0, res.output
        return [s.dur_us for s in ServingResult.model_validate_json(out.read_text()).steps]

    trace = tmp_path / "reqs.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,3\n")
    free, busy = steps("--host-us", "0"), steps("--host-us", "200")
    assert len(free) == len(busy) == 3
    assert all(b > f + 200 for f, b in zip(free, busy, strict=True))
    assert steps("--host", "none", "--host-us", "0") == steps("--host", "none")
