"""Shipped presets: every one resolves (by key and by HF id) and transformers builds its config."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from opgraph.capture import find_preset, presets, resolve
from opgraph.capture.sources import build_config

REQUIRED = {
    "llama-3.2-1b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen3-30b-a3b",
    "qwen2.5-7b",
    "qwen2.5-coder-32b",
    "mixtral-8x7b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "deepseek-v3",
    "gemma-3-27b",
    "bloom-560m",
    "vicuna-7b",
    "deepseek-r1-distill-qwen-32b",
}


def test_required_presets_are_shipped() -> None:
    assert set(presets()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_preset_builds_config(name: str) -> None:
    p = presets()[name]
    assert find_preset(p.hf_id) is p and find_preset(name.upper()) is p
    cfg = build_config(resolve(name), layers=2)
    assert cfg.num_hidden_layers == 2
    assert type(cfg).__name__.lower().startswith(p.config["model_type"].split("_")[0].replace("gemma3", "gemma3"))


def test_published_shapes() -> None:
    c = presets()["llama-3.1-70b"].config
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_key_value_heads"]) == (
        8192,
        28672,
        80,
        8,
    )
    q = presets()["qwen3-30b-a3b"].config
    assert (q["num_experts"], q["num_experts_per_tok"], q["moe_intermediate_size"]) == (128, 8, 768)
    d = presets()["deepseek-v3"].config
    assert (d["n_routed_experts"], d["kv_lora_rank"], d["num_hidden_layers"]) == (256, 512, 61)
