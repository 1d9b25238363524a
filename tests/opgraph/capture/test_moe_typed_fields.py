"""Capture fills an expert GEMM's typed facts itself (``Gemm.expert``: implementation, experts, top-k,
projection; ``issue``: how the host issues it), not through the legacy path that reads them from a
definition: the tests turn that path off while capturing, and compare with the tiny configs' own values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from opgraph.capture import capture  # noqa: E402
from opgraph.ir import ExpertGemm, ExpertPart, ExpertsImpl, Gemm, HostIssue, OpGraph  # noqa: E402
from tests.opgraph.capture.test_capture_architectures import BASE, TINY  # noqa: E402


@pytest.fixture
def no_legacy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops validated without ``expert``/``issue`` get no value from their definition."""
    from opgraph.ir import ops

    monkeypatch.setattr(ops, "legacy_facts", lambda op_type, definition: {})


def _config(tmp_path: Path, model_type: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    arch, own = TINY[model_type]
    cfg = {**BASE, **own, "model_type": model_type, "architectures": [arch], **extra}
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg


def _expert_gemms(g: OpGraph) -> list[Gemm]:
    return [o for o in g.ops if isinstance(o, Gemm) and o.target.startswith("moe_experts")]


def _want(cfg: dict[str, Any], impl: ExpertsImpl, target: str) -> ExpertGemm:
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    part = ExpertPart(target.removeprefix("moe_experts_"))
    return ExpertGemm(impl=impl, experts=experts, top_k=cfg["num_experts_per_tok"], part=part)


@pytest.mark.usefixtures("no_legacy_path")
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_a_grouped_kernel_expert_gemm_says_its_implementation_experts_and_top_k(
    tmp_path: Path, model_type: str
) -> None:
    path, cfg = _config(tmp_path, model_type)
    g = capture(path, device="meta", seq_len=12, dtype="bf16")
    gemms = _expert_gemms(g)
    assert len(gemms) == 2 * cfg["num_hidden_layers"]
    for op in gemms:
        assert op.groups > 1 and op.expert == _want(cfg, ExpertsImpl.GROUPED_MM, op.target), op.definition
        assert op.issue is HostIssue.CALL
    # dense GEMMs are no expert GEMMs
    assert all(o.expert is None for o in g.ops if isinstance(o, Gemm) and o not in gemms)


@pytest.mark.usefixtures("no_legacy_path")
def test_torch_fallback_products_say_their_host_issue(tmp_path: Path) -> None:
    path, cfg = _config(tmp_path, "qwen3_moe")
    g = capture(path, device="meta", seq_len=12, dtype="fp16")
    calls: dict[tuple[int | None, str], list[Gemm]] = {}
    for op in _expert_gemms(g):
        calls.setdefault((op.layer, op.target), []).append(op)
        assert op.groups == 1 and op.expert == _want(cfg, ExpertsImpl.GROUPED_MM, op.target)
    assert len(calls) == 2 * cfg["num_hidden_layers"]
    for first, *rest in calls.values():
        assert first.issue is HostIssue.SYNC and first.definition.endswith("@sync")
        assert rest and all(o.issue is HostIssue.NESTED and o.definition.endswith("@nested") for o in rest)


def _has_batched_mm() -> bool:
    from transformers.integrations import moe as hf_moe

    return hasattr(hf_moe, "batched_mm_experts_forward")


@pytest.mark.usefixtures("no_legacy_path")
@pytest.mark.skipif(not _has_batched_mm(), reason=f"transformers {transformers.__version__} has no batched_mm")
def test_a_batched_mm_expert_gemm_says_batched_mm(tmp_path: Path) -> None:
    path, cfg = _config(tmp_path, "qwen3_moe", experts_implementation="batched_mm")
    g = capture(path, phase="decode", batch=3, kv_len=8, device="meta")
    gemms = _expert_gemms(g)
    assert gemms
    for op in gemms:
        assert op.batch == 3 * cfg["num_experts_per_tok"]
        assert op.expert == _want(cfg, ExpertsImpl.BATCHED_MM, op.target) and op.issue is HostIssue.CALL


@pytest.mark.usefixtures("no_legacy_path")
def test_the_eager_loop_products_are_loop_expert_gemms(tmp_path: Path) -> None:
    path, cfg = _config(tmp_path, "qwen3_moe", experts_implementation="eager")
    g = capture(path, device="meta", seq_len=12)
    gemms = _expert_gemms(g)
    assert gemms
    for op in gemms:
        assert op.groups == 1 and op.expert == _want(cfg, ExpertsImpl.LOOP, op.target)
        assert op.issue is HostIssue.CALL  # the eager loop's products are Python-level calls
