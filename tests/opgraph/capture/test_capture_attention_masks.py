"""Attention ops carry what the model computes: sliding windows on the layers whose mask has one, and a
one-token GQA decode with the model's heads, checked against the masks and shapes transformers itself
builds on the CPU and against the config's head counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from opgraph.capture import capture
from opgraph.capture.api import CaptureOptions, prepare
from opgraph.ir import Attention, OpGraph, OpKind
from tests.opgraph.capture.test_capture_architectures import BASE, TINY, structure

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
"""The tiny configs' attention (BASE): two query heads per key/value head."""
WINDOW = 8
SEQ_LEN = 16
"""Prompt tokens: twice the window, so the window hides keys from the later queries."""

# Configs with a sliding window; which layers use it is transformers' business, found out by running.
WINDOWED: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("mistral", {"sliding_window": WINDOW}),  # no layer_types: every layer
    "starcoder2": ("starcoder2", {"sliding_window": WINDOW}),
    "phi3": ("phi3", {"sliding_window": WINDOW}),
    "qwen3_moe": ("qwen3_moe", {"sliding_window": WINDOW, "use_sliding_window": True}),
    "qwen3_moe-off": ("qwen3_moe", {"sliding_window": WINDOW, "use_sliding_window": False}),  # config drops it
    "qwen2-upper": ("qwen2", {"sliding_window": WINDOW, "use_sliding_window": True, "max_window_layers": 1}),
    "gemma3_text": ("gemma3_text", {"sliding_window": WINDOW}),  # layer_types from its pattern
}


def write_config(tmp_path: Path, model_type: str, extra: dict[str, Any]) -> str:
    """A tiny config of ``model_type`` (the architecture tests' sizes) with ``extra`` on top."""
    arch, tiny_extra = TINY[model_type]
    cfg = {**BASE, **tiny_extra, **extra, "model_type": model_type, "architectures": [arch]}
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def attention(g: OpGraph) -> list[Attention]:
    """The graph's attention ops, in order."""
    return [o for o in g.ops_of(OpKind.ATTENTION) if isinstance(o, Attention)]


def masked_pairs_per_layer(path: str, seq_len: int) -> list[int]:
    """Query-key pairs one head attends in each layer of a real CPU prefill: counted from the mask (or
    the causal flag) transformers hands to SDPA."""
    prepared = prepare(path, CaptureOptions(device="cpu", dtype="fp32", seq_len=seq_len))
    pairs: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        mask = kwargs.get("attn_mask", args[0] if args else None)
        q_len, kv_len = q.shape[-2], k.shape[-2]
        if mask is None:
            causal = bool(kwargs.get("is_causal", False))
            allowed = [sum(1 for j in range(kv_len) if not causal or j <= i) for i in range(q_len)]
            pairs.append(sum(allowed))
        else:
            head = mask[0, 0] if mask.dim() == 4 else mask
            pairs.append(int(head.sum() if head.dtype == torch.bool else (head == 0).sum()))
        return sdpa(q, k, v, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        prepared.model(torch.zeros((1, seq_len), dtype=torch.long))
    return pairs


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_windows_follow_the_masks_transformers_builds(tmp_path: Path, name: str) -> None:
    model_type, extra = WINDOWED[name]
    path = write_config(tmp_path, model_type, extra)
    real = masked_pairs_per_layer(path, SEQ_LEN)
    ops = attention(capture(path, seq_len=SEQ_LEN))
    assert [o.pairs for o in ops] == real
    full = SEQ_LEN * (SEQ_LEN + 1) // 2
    assert [o.window for o in ops] == [WINDOW if p < full else None for p in real]


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_a_window_that_masks_nothing_yet_is_still_the_layers(tmp_path: Path, name: str) -> None:
    # A prompt shorter than the window: transformers masks causally only, and the sliding layers keep
    # their window (the one recorded where it masks), so a template this short still tells them apart.
    model_type, extra = WINDOWED[name]
    path = write_config(tmp_path, model_type, extra)
    short = WINDOW - 2
    ops = attention(capture(path, seq_len=short))
    assert [o.pairs for o in ops] == masked_pairs_per_layer(path, short)
    assert [o.window for o in ops] == [o.window for o in attention(capture(path, seq_len=SEQ_LEN))]
    # The window hides no key: the plain causal kernel, named as a layer without a window.
    assert all(not o.definition.endswith(f"_w{WINDOW}") for o in ops)


def test_mistral_windows_every_layer(tmp_path: Path) -> None:
    # Mistral's config has no layer_types: transformers windows every layer, so a head attends
    # 1 + 2 + ... + 8 keys for the first 8 queries and 8 for each of the other 8: 100 pairs, not 136.
    ops = attention(capture(write_config(tmp_path, "mistral", {"sliding_window": WINDOW}), seq_len=SEQ_LEN))
    assert [(o.window, o.pairs) for o in ops] == [(WINDOW, 100), (WINDOW, 100)]
    assert all(o.definition.endswith(f"_w{WINDOW}") for o in ops)


def _decode_fields(ops: list[Attention]) -> set[tuple[Any, ...]]:
    return {(o.heads, o.kv_heads, o.q_len, o.causal, o.variant.value, o.head_dim) for o in ops}


@pytest.mark.parametrize("model_type", ["mistral", "gemma3_text"])
def test_masked_gqa_decode_has_the_model_heads(tmp_path: Path, model_type: str) -> None:
    # Past the window the decode step has a mask, and transformers 5.18 on runs it on the key/value
    # heads with the query groups packed into the query length: still 4 heads over 2, one query each.
    path = write_config(tmp_path, model_type, {"sliding_window": WINDOW})
    g = capture(path, phase="decode", batch=2, kv_len=3 * WINDOW)
    ops = attention(g)
    assert len(ops) == 2
    assert _decode_fields(ops) == {(HEADS, KV_HEADS, 1, False, "gqa", HEAD_DIM)}
    for o in ops:
        assert o.definition.startswith(f"gqa_paged_decode_h{HEADS}_kv{KV_HEADS}_d{HEAD_DIM}")
        # The one query of each sequence and head sees the window's keys: QK^T and PV over them.
        assert o.flops == 2 * 2 * HEADS * WINDOW * (2 * HEAD_DIM)
        assert o.inputs[0].shape == (2, HEADS, 1, HEAD_DIM) and o.outputs[0].shape == (2, HEADS, 1, HEAD_DIM)
    # Eager attention expands the key/value heads instead: the same attention, run as its own kernels
    # (one query multiplies every key it holds, as the fused kernel does).
    eager = attention(capture(path, phase="decode", batch=2, kv_len=3 * WINDOW, attn_impl="eager"))
    fields = ("heads", "kv_heads", "q_len", "kv_len", "causal", "window", "flops")
    assert [[getattr(o, f) for f in fields] for o in ops] == [[getattr(o, f) for f in fields] for o in eager]
    assert [f"eager_{o.definition}" for o in ops] == [o.definition for o in eager]
    assert all(o.eager is None for o in ops) and all(o.eager for o in eager)  # type: ignore[attr-defined]
    cpu = capture(path, phase="decode", batch=2, kv_len=3 * WINDOW, device="cpu")
    assert structure(cpu) == structure(g)


def test_masked_gqa_decode_steps_of_generate(tmp_path: Path) -> None:
    path = write_config(tmp_path, "mistral", {"sliding_window": WINDOW})
    g = capture(path, phase="generate", seq_len=SEQ_LEN, new_tokens=3)
    decode = [o for o in attention(g) if o.stage is not None and o.stage.value == "decode"]
    assert len(decode) == 2 * 3
    assert _decode_fields(decode) == {(HEADS, KV_HEADS, 1, False, "gqa", HEAD_DIM)}
    prefill = [o for o in attention(g) if o.stage is not None and o.stage.value == "prefill"]
    assert {(o.heads, o.kv_heads, o.q_len, o.causal, o.window) for o in prefill} == {
        (HEADS, KV_HEADS, SEQ_LEN, True, WINDOW)
    }
