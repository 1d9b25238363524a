"""What families no measurement had seen exposed (``benchmarks/results/gpu/h100/heldout/family-check-1950/``),
each fixed at its root: the cost cache kept one layout per op config, dense GEMMs over unaligned rows had no
points, a decode whose keys fill a sliding window was priced as the unmasked kernel, a call that CUDA runs on SDPA's
math path was priced as a fused kernel, and a rotary embedding under float32 tables as a bfloat16 one."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from hardware import ProfileModel, cost_graph, load_hardware
from hardware.models.profile import float_tables, profile_features
from opgraph.cli.app import app
from opgraph.ir import (
    Attention,
    DType,
    Gemm,
    Memory,
    OpGraph,
    Rope,
    TensorSpec,
    eager_parts,
    load_graph,
    sdpa_math_passes,
)
from tests.conftest import REPO

CONFIGS = REPO / "benchmarks" / "gpu" / "configs"


def _kv_write(op_id: int, strides: tuple[int, ...] | None) -> Memory:
    """A decode's KV-cache ``cat`` of 1024 cached tokens and one new one, as GPT-NeoX records its key (made
    contiguous by the rotary ``cat``) and its value (a slice of the fused qkv projection)."""
    cache = TensorSpec(shape=(16, 16, 1024, 128), dtype=DType.fp16)
    new = TensorSpec(shape=(16, 16, 1, 128), dtype=DType.fp16, strides=strides)
    out = TensorSpec(shape=(16, 16, 1025, 128), dtype=DType.fp16)
    return Memory(id=op_id, fn="kv_cache_write", numel=16 * 16 * 1025 * 128, dtype=DType.fp16, inputs=(cache, new),
                  outputs=(out,))  # fmt: skip


def test_ops_of_one_config_but_other_layouts_are_costed_apart() -> None:
    # The key's and the value's cache writes share every field; the value's new token is a strided view, so
    # CUDA's cat runs its non-vectorised kernel for the whole copy (Pythia-1.4B b16: 203 us against 42). The
    # cache used to give the second the first's cost.
    hw = load_hardware("h100")
    graph = OpGraph(ops=(_kv_write(0, None), _kv_write(1, (6144, 384, 6144, 1))))
    costs = cost_graph(graph, ProfileModel(writeback=False), hw)
    assert costs.unique_configs == 2
    assert costs.costs[1].seconds > 3 * costs.costs[0].seconds
    assert ":strided" in costs.costs[1].detail and ":strided" not in costs.costs[0].detail


def _lm_head(n: int, dtype: DType = DType.fp16) -> Gemm:
    ins = (TensorSpec(shape=(4096, 1024), dtype=dtype), TensorSpec(shape=(n, 1024), dtype=dtype))
    return Gemm(id=0, m=4096, n=n, k=1024, dtype=dtype, inputs=ins, outputs=(TensorSpec(shape=(4096, n), dtype=dtype),))


def test_a_gemm_over_unaligned_rows_is_priced_from_points_measured_that_way() -> None:
    # GPT-2's vocabulary of 50257: cuBLAS runs an align-1 kernel, 4.0 ms at 4096 rows where the aligned
    # 50304 takes 0.57 (GPT-2 medium's prefill was 21% short on its lm_head alone).
    hw = load_hardware("h100")
    model = ProfileModel()
    odd, even = model.estimate(_lm_head(50257), hw), model.estimate(_lm_head(50304), hw)
    assert profile_features(_lm_head(50257)).regime == "gemm:unaligned"
    assert "gemm:unaligned fp16" in odd.detail and "no gemm:unaligned points" not in odd.detail
    assert odd.seconds > 5 * even.seconds
    assert 3.0e-3 < odd.seconds < 5.5e-3
    # the H200 measured them too (profile_resume.sh, 2026-11-27 23:03 UTC)
    h200 = load_hardware("h200")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        odd, even = model.estimate(_lm_head(50257), h200), model.estimate(_lm_head(50304), h200)
    assert "gemm:unaligned fp16" in odd.detail and odd.seconds > 5 * even.seconds


def _decode(window: int | None, kv_len: int = 4096) -> Attention:
    return Attention(id=0, batch=4, q_len=1, kv_len=kv_len, heads=24, kv_heads=2, head_dim=128, causal=False,
                     window=window)  # fmt: skip


@given(kv=st.integers(1, 1 << 16), window=st.one_of(st.none(), st.integers(1, 1 << 16)))
def test_the_window_is_full_once_the_keys_reach_it(kv: int, window: int | None) -> None:
    op = Attention(id=0, batch=1, q_len=1, kv_len=kv, heads=8, kv_heads=8, head_dim=64, window=window)
    assert op.window_full == (window is not None and kv >= window)
    regime = profile_features(op).regime
    assert regime == ("attention:decode:masked" if op.window_full else "attention:decode")


def test_a_decode_that_fills_its_window_is_priced_as_the_masked_kernel_it_runs() -> None:
    # A sliding layer's cache keeps window - 1 keys, so a decode past the window sees exactly `window` keys,
    # and transformers passes SDPA a mask: on an H100 cuDNN's prefill kernel over every key (StarCoder2-3B b4:
    # 87 us a layer, 13 without the mask).
    hw = load_hardware("h100")
    model = ProfileModel()
    masked, plain = model.estimate(_decode(4096), hw), model.estimate(_decode(None), hw)
    assert "attention:decode:masked" in masked.detail
    assert masked.seconds > 4 * plain.seconds
    assert 60e-6 < masked.seconds < 110e-6


def test_the_replay_gives_a_decode_that_fills_its_window_a_mask() -> None:
    import torch

    from validators.recipes import BuildContext, RecipeSelector

    ctx = BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    op = Attention(id=0, batch=1, q_len=1, kv_len=64, heads=4, kv_heads=2, head_dim=16, causal=False, window=64)
    case = RecipeSelector().select(op).recipe.build(op, ctx)  # type: ignore[union-attr]
    assert "bool mask" in case.note and "packed gqa" in case.note
    assert case.inputs[3] is not None
    unmasked = (
        RecipeSelector()
        .select(op.model_copy(update={"window": None}))
        .recipe.build(  # type: ignore[union-attr]
            op.model_copy(update={"window": None}), ctx
        )
    )
    assert unmasked.inputs[3] is None


@pytest.mark.parametrize(("config", "math"), [("falcon-7b", True), ("mistral-7b-v0.1", False)])
def test_capture_prices_an_attention_on_the_math_path_as_that_path_runs(
    tmp_path: Path, config: str, math: bool
) -> None:
    # Falcon-7B calls SDPA with 71 query heads over one key head and no enable_gqa: no fused kernel takes it, and
    # CUDA's math path ran its prefill's attention in 26 ms where a fused kernel is priced at 0.35. The graph says
    # so and holds the math path's kernels; a GQA model that SDPA fuses holds one fused op.
    out = tmp_path / "g.json"
    args = ["capture", str(CONFIGS / f"{config}.json"), "--layers", "1", "--seq-len", "2048", "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    graph = load_graph(out)
    notes = [a for a in graph.metadata.assumptions if "math path" in a]
    (att,) = [op for op in graph.ops if isinstance(op, Attention)]
    assert bool(notes) == math == att.math
    if not math:
        return
    assert "71 query heads over 1 key/value heads" in notes[0] and "math path" in " ".join(result.output.split())
    parts = eager_parts(att)
    assert [p.dtype for p in parts if isinstance(p, Gemm)] == [DType.fp32, DType.fp32]
    assert [getattr(p, "fn", p.kind.value) for p in parts if not isinstance(p, Gemm)] == [
        "cast", "cast", "cast", "mul", "mul", "add", "softmax", "isneginf", "all", "where", "cast", "cast"
    ]  # fmt: skip
    hw = load_hardware("h100")
    fused = att.model_copy(update={"math": False, "eager": None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ProfileModel().estimate(att, hw).seconds > 20 * ProfileModel().estimate(fused, hw).seconds


def test_the_math_paths_expanded_keys_are_a_strided_copy_and_its_values_are_not() -> None:
    # A decode of several sequences copies the transposed keys and the values of one head to every query head
    # (matmul cannot fold the broadcast into its batch): 514 us and 178 us for the same bytes on an H100.
    att = Attention(id=0, batch=8, q_len=1, kv_len=2049, heads=71, kv_heads=1, head_dim=64, causal=False, math=True,
                    eager=sdpa_math_passes(mask_bytes=1, heads=71, half=True))  # fmt: skip
    keys, values = (p for p in eager_parts(att) if isinstance(p, Memory) and p.fn == "copy")
    assert keys.numel == values.numel == 8 * 71 * 2049 * 64
    assert profile_features(keys).regime == "memory:copy:broadcast:strided"
    assert profile_features(values).regime == "memory:copy:broadcast"
    hw = load_hardware("h100")
    assert ProfileModel().estimate(keys, hw).seconds > 2 * ProfileModel().estimate(values, hw).seconds
    # repeat_kv's expanded keys (row-major under the broadcast) keep the plain broadcast regime
    kv = TensorSpec(shape=(1, 8, 4, 512, 128), dtype=DType.bf16, strides=(8 * 512 * 128, 512 * 128, 0, 128, 1))
    repeat = Memory(id=0, fn="repeat_kv", numel=32 * 512 * 128, inputs=(kv,))
    assert profile_features(repeat).regime == "memory:repeat_kv:broadcast"


def _rope(table: DType) -> Rope:
    q = TensorSpec(shape=(1, 32, 4096, 128), dtype=DType.bf16, strides=(4096 * 32 * 128, 128, 32 * 128, 1))
    cos = TensorSpec(shape=(1, 1, 4096, 128), dtype=table)
    out = TensorSpec(shape=(1, 32, 4096, 128), dtype=DType.bf16)
    return Rope(id=0, tokens=4096, heads=32, head_dim=128, inputs=(q, cos, cos), outputs=(out,))


def test_a_rotary_embedding_under_float32_tables_is_priced_as_the_float32_rotation_it_runs() -> None:
    # OLMo 2 keeps cos/sin in float32 under bfloat16 queries: the rotation runs in float32 before the cast back,
    # 1.6-1.9x what bfloat16 tables' points give (its 4096-token prefill was 6.9% short on it).
    hw = load_hardware("h100")
    wide, plain = _rope(DType.fp32), _rope(DType.bf16)
    assert float_tables(wide) and not float_tables(plain)
    assert profile_features(wide).regime == "rope:float_tables" and profile_features(plain).regime == "rope"
    assert ProfileModel().estimate(wide, hw).seconds > 1.4 * ProfileModel().estimate(plain, hw).seconds
