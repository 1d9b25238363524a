"""Replay of graphs captured from tiny real models (Llama and Qwen3-MoE configs): every config runs and
matches float64 on the CPU, prefill and decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_helpers import FAST

from validators import ReplayStatus, replay_graph, unique_configs

capture_api = pytest.importorskip("opgraph.capture")

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
}  # fmt: skip
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 256, "decoder_sparse_step": 1, "mlp_only_layers": [],
}  # fmt: skip


def _config(tmp_path: Path, name: str, data: dict[str, object]) -> Path:
    p = tmp_path / name / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize(
    ("name", "config", "kwargs"),
    [
        ("llama", LLAMA, {"phase": "prefill", "seq_len": 12}),
        ("llama", LLAMA, {"phase": "decode", "batch": 2, "kv_len": 16}),
        ("qwen3moe", QWEN3_MOE, {"phase": "prefill", "seq_len": 16}),
    ],
)
def test_captured_graph_replays_fully(
    tmp_path: Path, name: str, config: dict[str, object], kwargs: dict[str, object]
) -> None:
    graph = capture_api.capture(str(_config(tmp_path, name, config)), **kwargs)
    configs = unique_configs(graph)
    results = list(replay_graph(graph, "cpu", FAST))
    assert len(results) == len(configs)
    not_ok = [(r.definition, r.status.value, r.reason) for r in results if r.status is not ReplayStatus.OK]
    assert not not_ok
    kinds = {r.kind.value for r in results}
    assert {"gemm", "attention", "norm"} <= kinds
    if name == "qwen3moe":
        assert "moe_routing" in kinds
    assert all(r.numerics is not None and r.numerics.compared >= 1 for r in results if r.kind.value == "gemm")


GEMMA = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 256,
    "sliding_window": 8, "hidden_activation": "gelu_pytorch_tanh",
}  # fmt: skip


@pytest.mark.parametrize(
    ("model_type", "arch"), [("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM")]
)
def test_gemma_gated_tanh_gelu_replays_and_matches_its_formula(tmp_path: Path, model_type: str, arch: str) -> None:
    import math

    import torch

    from validators import replay_op
    from validators.recipes import BuildContext, RecipeSelector

    cfg = {**GEMMA, "model_type": model_type, "architectures": [arch]}
    graph = capture_api.capture(str(_config(tmp_path, model_type, cfg)), phase="prefill", seq_len=8)
    (act,) = {op.definition: op for op in graph.ops if op.kind.value == "activation" and op.gated}.values()
    result = replay_op(act, "cpu", FAST)
    assert result.status is ReplayStatus.OK, result.reason
    assert result.numerics is not None and result.numerics.compared >= 1
    # The float64 reference is gelu's tanh approximation of the gate times up (HF's gelu_pytorch_tanh),
    # written out here rather than through torch's gelu.
    recipe = RecipeSelector().select(act).recipe
    assert recipe is not None
    case = recipe.build(act, BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0)))
    gate, up = (x.double() for x in case.inputs)
    expected = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3))) * up
    torch.testing.assert_close(case.run((gate, up), True), expected, rtol=1e-12, atol=1e-12)
