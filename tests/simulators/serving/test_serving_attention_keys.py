"""``opgraph serve-sim`` prices each step over the keys the model reads, checked against transformers
itself running that step (a fresh capture, simulated with the same hardware, cost model and settings).

gpt-oss-20b alternates sliding-window (128) and full layers: its serving templates (37 and 41 tokens)
are shorter than the window, yet a long context's sliding layers read the window only. DeepSeek-V3's
MLA up-projects its whole latent cache every step: a chunk of a chunked prefill over a prefix as much
as a decode. Two layers keep each capture quick; the device alone is timed (``--host none``), so that
the attention's share of a step shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hardware import load_hardware, resolve_cost_model
from opgraph.cli.app import app
from opgraph.ir import OpGraph, OpKind
from opgraph.study import run_study, study_config
from simulators.serving import ServingResult

LAYERS = 2
"""gpt-oss: one sliding and one full layer; DeepSeek-V3: two dense MLA layers."""


def _serve(tmp_path: Path, model: str, prompt: int, output: int, *args: str) -> dict[str, float]:
    """Step time (us) of each bucketed step key of one request served by ``opgraph serve-sim``."""
    trace, out = tmp_path / "reqs.csv", tmp_path / "serve.json"
    trace.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,{prompt},{output}\n")
    cli = ["serve-sim", model, "--layers", str(LAYERS), "--requests", str(trace), "-c", "roofline", "--host", "none"]
    res = CliRunner().invoke(app, [*cli, *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert result.summary.completed == 1
    return {s.key: s.dur_us for s in result.steps}


def _simulated_us(graph: OpGraph) -> float:
    """What serve-sim's defaults here make of one step graph: H100, roofline, no host time."""
    config = study_config(tp=1, host_mode="none")
    return float(run_study(graph, load_hardware("h100"), resolve_cost_model("roofline"), config).result.makespan_us)


def _capture(model: str, **options: Any) -> OpGraph:
    from opgraph.capture import capture

    return capture(model, layers=LAYERS, dtype="bf16", **options)


def _capture_chunk(model: str, prefix: int, q_len: int) -> OpGraph:
    """transformers running one sequence's chunk of ``q_len`` prompt tokens over a cache of ``prefix``."""
    import torch

    from opgraph.capture.api import _metadata_args, graph_from_recording, prepare
    from opgraph.capture.phase import CaptureOptions, PhaseRun, setup_phase, token_ids
    from opgraph.capture.recorder import Recorder

    opts = CaptureOptions(phase="decode", batch=1, kv_len=prefix, dtype="bf16", layers=LAYERS)
    prepared = prepare(model, opts)
    cache = setup_phase(prepared, opts)
    rec = Recorder()
    rec.add_root(prepared.model)
    with torch.no_grad():
        PhaseRun(prepared, opts, rec, cache).forward(token_ids(prepared, opts, 1, q_len, seed=2), "prefill", 0)
    graph, _ = graph_from_recording(rec, **_metadata_args(prepared, opts))
    return graph


def test_sliding_layers_read_the_window_at_long_contexts(tmp_path: Path) -> None:
    # A 4096-token prompt (the sliding layer's queries see 128 keys each), then one decode over the
    # 4096 cached tokens plus the new one, priced at the bucket of 4352 keys: the sliding layer's
    # cache holds the last 127 tokens, so it reads 128 keys, the full layer 4352.
    steps = _serve(tmp_path, "gpt-oss-20b", 4096, 2)
    assert steps["prefill 1x4096/4096"] == pytest.approx(_simulated_us(_capture("gpt-oss-20b", seq_len=4096)), rel=1e-9)
    fresh = _capture("gpt-oss-20b", phase="decode", batch=1, kv_len=4351)
    assert steps["decode 1@4352"] == pytest.approx(_simulated_us(fresh), rel=1e-9)


def test_mla_chunks_and_decodes_up_project_the_whole_latent_cache(tmp_path: Path) -> None:
    # Chunked prefill of 4096 tokens in chunks of 512: the last chunk up-projects 4096 latent rows
    # (the 3584 cached ones and its own), not 512. The decodes that follow cross from the 4352-key
    # bucket to the 4608 one at one batch size, where serve-sim rewrites only what depends on the keys.
    steps = _serve(tmp_path, "deepseek-v3", 4096, 300, "--scheduler", "chunked", "--token-budget", "512")
    # The chunk over a prefix runs SDPA with the mask transformers builds for it (its ops and the mask's
    # bytes, 0.3% here), which the template, captured with no prefix, does not show. Skipping the
    # cached rows' up-projection cost 15%.
    assert steps["prefill 1x512/4096"] == pytest.approx(
        _simulated_us(_capture_chunk("deepseek-v3", 3584, 512)), rel=1e-9
    )
    for keys in (4352, 4608):
        fresh = _capture("deepseek-v3", phase="decode", batch=1, kv_len=keys - 1)
        assert steps[f"decode 1@{keys}"] == pytest.approx(_simulated_us(fresh), rel=1e-9)


def test_a_decode_batch_of_short_and_long_contexts_reads_the_mean_of_their_capped_lengths(tmp_path: Path) -> None:
    # A 10000-token prompt and a 60-token one, prefilled in one step, then one decode step over 10001
    # and 61 keys: the full layer reads their mean, 5031 (bucket 5120); the sliding layer (window 128)
    # min(10001, 128) and 61 keys, (128 + 61) / 2 = 94.5 a decode (bucket 96), not min(5031, 128) = 128.
    from opgraph.scenario.serving import capture_serving_model
    from opgraph.transforms import rebatch

    trace, out = tmp_path / "reqs.csv", tmp_path / "serve.json"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10000,2\n0,60,2\n")
    cli = ["serve-sim", "gpt-oss-20b", "--layers", str(LAYERS), "--requests", str(trace), "-c", "roofline"]
    res = CliRunner().invoke(app, [*cli, "--host", "none", "--token-budget", "16384", "-o", str(out)])
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    decodes = [s for s in result.steps if s.kind == "decode"]
    assert [s.key for s in decodes] == ["decode 2@5120 (w128@96)"]
    templates = capture_serving_model("gpt-oss-20b", layers=LAYERS)
    assert templates.windows == (128,)
    step = rebatch(templates.decode, batch=2, kv_len=5120, window_kv={128: 96})
    assert [(a.layer, a.kv_len) for a in step.ops_of(OpKind.ATTENTION)] == [(0, 96), (1, 5120)]  # type: ignore[attr-defined]
    assert decodes[0].dur_us == pytest.approx(_simulated_us(step), rel=1e-9)
    # Priced at the mean alone, the sliding layer read 128 keys a decode: a dearer step.
    assert decodes[0].dur_us < _simulated_us(rebatch(templates.decode, batch=2, kv_len=5120))
