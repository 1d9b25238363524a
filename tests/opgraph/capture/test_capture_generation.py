"""Generate captures built from step templates equal the fully recorded graph, op for op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from opgraph.capture.api import CaptureOptions, capture, prepare, record, setup_phase
from opgraph.capture.generation import FALLBACK_NOTE, _grown_cache
from opgraph.capture.phase import PhaseRun
from opgraph.ir import OpGraph, OpKind
from opgraph.ir.io import load_graph, save_graph
from tests.opgraph.capture.test_capture_architectures import tiny_config


def _full(path: str, seq_len: int, new_tokens: int, **options: object) -> OpGraph:
    """Every step recorded (what capture did before plans)."""
    opts = CaptureOptions.model_validate({"phase": "generate", "seq_len": seq_len, "new_tokens": new_tokens, **options})
    return record(path, opts).graph


def _same(planned: OpGraph, full: OpGraph) -> None:
    assert [o.model_dump() for o in planned.ops] == [o.model_dump() for o in full.ops]
    assert [e.model_dump() for e in planned.edges] == [e.model_dump() for e in full.edges]
    plan_md = planned.metadata.model_copy(update={"assumptions": full.metadata.assumptions})
    assert plan_md == full.metadata


@pytest.mark.parametrize(
    ("model_type", "new_tokens", "options"),
    [
        ("llama", 4, {}),
        ("llama", 8, {}),
        ("llama", 5, {"batch": 2, "attn_impl": "eager"}),  # eager attention builds a mask as long as the cache
        ("qwen3_moe", 5, {}),
        ("deepseek_v3", 6, {}),
    ],
)
def test_planned_generation_equals_the_recorded_one(
    tmp_path: Path, model_type: str, new_tokens: int, options: dict[str, object]
) -> None:
    path = tiny_config(tmp_path, model_type)
    planned = capture(path, phase="generate", seq_len=6, new_tokens=new_tokens, **options)  # type: ignore[arg-type]
    assert planned.generation is not None
    assert planned.generation.last_step == new_tokens
    assert len(planned.recorded_ops) < len(planned.ops)
    _same(planned, _full(path, 6, new_tokens, **options))


def test_sliding_window_past_the_window_records_every_step(tmp_path: Path) -> None:
    # gemma2's sliding layers keep at most 8 tokens: from there on the step is no longer the same step
    # at a longer KV length, which the check of the last step finds.
    path = tiny_config(tmp_path, "gemma2")
    g = capture(path, phase="generate", seq_len=4, new_tokens=7)
    assert g.generation is None
    assert any(note.startswith(FALLBACK_NOTE.split("(")[0]) for note in g.metadata.assumptions)
    full = _full(path, 4, 7)
    assert [o.model_dump() for o in g.ops] == [o.model_dump() for o in full.ops]
    assert [e.model_dump() for e in g.edges] == [e.model_dump() for e in full.edges]


def test_planned_summary_save_and_load(tmp_path: Path, tiny_config: str) -> None:
    planned = capture(tiny_config, phase="generate", seq_len=8, new_tokens=9)
    full = _full(tiny_config, 8, 9)
    assert planned.summary() == full.summary()
    assert planned.ops_of(OpKind.ATTENTION) == full.ops_of(OpKind.ATTENTION)
    # The sampler's ops (an argmax, an isin left as 'other'), in every step (the last one too):
    sampler = planned.ops_of(OpKind.TOPK, OpKind.OTHER)
    assert sampler == full.ops_of(OpKind.TOPK, OpKind.OTHER) and len(sampler) == 2 * 10
    last = full.ops[-1]
    assert (
        planned.op(last.id) == last
        and planned.ops[-1] == last
        and planned.ops[len(full.ops) // 2 + 3] == full.ops[len(full.ops) // 2 + 3]
    )
    assert planned.expand().ops == full.ops
    saved = save_graph(planned, tmp_path / "g.json")
    raw = json.loads(saved.read_text())
    assert raw["schema_version"] == 2 and len(raw["ops"]) == len(planned.recorded_ops)
    loaded = load_graph(saved)
    assert loaded == planned
    assert [o.model_dump() for o in loaded.ops] == [o.model_dump() for o in full.ops]
    assert json.loads(save_graph(full, tmp_path / "full.json").read_text())["schema_version"] == 1


def test_meta_cache_for_the_last_step_is_grown_directly(tiny_config: str) -> None:
    # The check of the last step needs a cache at its length; on meta a plain growing cache is made at
    # that length instead of running a prompt of that length.
    opts = CaptureOptions(phase="generate", seq_len=5, new_tokens=4)
    prepared = prepare(tiny_config, opts)
    run = PhaseRun(prepared, opts, None, setup_phase(prepared, opts))
    import torch

    with torch.no_grad():
        run.prefill()
    grown = _grown_cache(run.cache, prepared.config, 11)
    assert grown is not None and grown.get_seq_length() == 11
