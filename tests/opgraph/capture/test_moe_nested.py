"""Capture marks the products torch's ``_grouped_mm`` fallback issues from C++ (fp16: one ``mm`` per
expert inside one Python-level call) as nested, so the host model charges them no framework time;
a grouped kernel (bf16) is not nested."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hardware.hostprofile import NESTED_MARK, is_nested
from opgraph.capture import capture
from opgraph.capture.lowering import moe
from opgraph.ir.ops import OpKind
from tests.opgraph.capture.test_capture_architectures import tiny_config


def _experts(g: object) -> list[object]:
    return [o for o in g.ops_of(OpKind.GEMM) if o.target.startswith("moe_experts")]  # type: ignore[attr-defined]


def test_capture_and_the_host_model_share_one_mark() -> None:
    assert moe.NESTED_MARK == NESTED_MARK


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_fallback_products_are_nested_a_grouped_kernel_is_not(tmp_path: Path, model_type: str) -> None:
    path = tiny_config(tmp_path, model_type)
    fp16 = _experts(capture(path, device="meta", seq_len=12, dtype="fp16"))
    assert len(fp16) > 4 and all(is_nested(o) for o in fp16)  # type: ignore[arg-type]
    bf16 = _experts(capture(path, device="meta", seq_len=12, dtype="bf16"))
    assert bf16 and not any(is_nested(o) for o in bf16)  # type: ignore[arg-type]
    # nothing else of the graph is nested: the offsets copy that starts each call is a Python-level op
    g = capture(path, device="meta", seq_len=12, dtype="fp16")
    assert sum(is_nested(o) for o in g.ops) == len(fp16)
