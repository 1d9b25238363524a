"""The ``profile`` cost model: efficiencies recovered from a synthetic profile, regimes, extrapolation, bad input."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from hardware import (
    CostModelError,
    ProfileExtrapolationWarning,
    ProfileModel,
    ProfilePoint,
    RooflineModel,
    default_cost_model,
    hardware_profile,
    load_hardware,
    load_profile,
    resolve_cost_model,
)
from hardware.models.profile import roofline_seconds
from opgraph.ir import Attention, DType, Gemm, LoadError, Norm, OpBase, SchemaVersionError
from tests.hardware.profile_builders import gemm_eff, gemm_points, norm_eff, synthetic_profile

H100 = load_hardware("h100")


def _quiet(model: ProfileModel, op: OpBase) -> tuple[float, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cost = model.estimate(op, H100)
    return cost.seconds, cost.detail


def test_recovers_the_measured_efficiency_at_and_between_measured_sizes() -> None:
    model = ProfileModel(synthetic_profile(H100))
    for m in (1, 16, 64, 1024, 4096, 2, 100, 3000):  # measured, and between measured sizes (log-linear in m)
        op = Gemm(id=0, m=m, n=14336, k=4096)
        seconds, detail = _quiet(model, op)
        assert seconds == pytest.approx(roofline_seconds(op, H100) / gemm_eff(m, 14336, 4096), rel=1e-9), m
        assert "extrapolated" not in detail
    norm = Norm(id=0, rows=64, hidden=4096)
    seconds, _ = _quiet(model, norm)
    assert seconds == pytest.approx(roofline_seconds(norm, H100) / norm_eff(norm.total_bytes), rel=1e-9)


def test_unmeasured_shape_between_measured_ones_is_weighted_from_its_neighbours() -> None:
    model = ProfileModel(synthetic_profile(H100))
    op = Gemm(id=0, m=256, n=8192, k=4096)  # n between the measured 4096 and 14336
    seconds, detail = _quiet(model, op)
    eff = roofline_seconds(op, H100) / seconds
    lo, hi = sorted((gemm_eff(256, 4096, 4096), gemm_eff(256, 14336, 4096)))
    assert lo < eff < hi
    assert "w 0." in detail and "extrapolated" not in detail


def test_decode_profile_predicts_a_prefill_through_the_roofline_not_by_flops() -> None:
    """Issue 18: a table measured at decode sizes predicted prefills 6-33x too slow (time scaled by
    FLOPs past the memory/compute boundary). The profile keeps the edge's efficiency instead."""
    decode_only = synthetic_profile(H100, gemm_points(H100, ms=(1, 2, 4, 8)))
    model = ProfileModel(decode_only, path=None)
    op = Gemm(id=0, m=8192, n=4096, k=4096)
    with pytest.warns(ProfileExtrapolationWarning, match="extrapolates"):
        cost = model.estimate(op, H100)
    assert cost.seconds == pytest.approx(roofline_seconds(op, H100) / gemm_eff(8, 4096, 4096), rel=1e-9)
    assert "extrapolated" in cost.detail and "past the largest" in cost.detail
    edge = Gemm(id=0, m=8, n=4096, k=4096)
    flop_scaled = model.estimate(edge, H100).seconds * op.flops / edge.flops
    assert cost.seconds < flop_scaled / 10


def test_warns_once_per_model_and_names_far_shapes() -> None:
    model = ProfileModel(synthetic_profile(H100))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        far_n = model.estimate(Gemm(id=0, m=64, n=256, k=4096), H100)  # n 16x under the measured shapes
        model.estimate(Gemm(id=0, m=64, n=128, k=4096), H100)
    assert [w.category for w in caught] == [ProfileExtrapolationWarning]
    assert "shape 16x outside the measured shapes" in far_n.detail


def test_dtypes_are_kept_apart_and_a_missing_dtype_says_so() -> None:
    pts = [*gemm_points(H100), *gemm_points(H100, dtype=DType.fp16)]
    model = ProfileModel(synthetic_profile(H100, pts))
    for dt in (DType.bf16, DType.fp16):
        op = Gemm(id=0, m=64, n=4096, k=4096, dtype=dt)
        assert _quiet(model, op)[0] == pytest.approx(roofline_seconds(op, H100) / gemm_eff(64, 4096, 4096, dt))
    fp32 = model.estimate(Gemm(id=0, m=64, n=4096, k=4096, dtype=DType.fp32), H100)
    assert "no fp32 points, from bf16" in fp32.detail


def test_kinds_the_profile_lacks_go_to_the_roofline_and_say_so() -> None:
    model = ProfileModel(synthetic_profile(H100))
    op = Attention(id=0, batch=1, q_len=512, kv_len=512, heads=32, kv_heads=8, head_dim=128)
    cost = model.estimate(op, H100)
    assert cost.seconds == pytest.approx(RooflineModel().estimate(op, H100).seconds)
    assert cost.detail.startswith("profile: not in the profile (attention:prefill)")


def test_attention_stages_are_separate_regimes() -> None:
    decode = [
        Attention(id=0, batch=8, q_len=1, kv_len=kv, heads=32, kv_heads=8, head_dim=128) for kv in (128, 1024, 8192)
    ]
    pts = [p for p in synthetic_profile(H100).points]
    from tests.hardware.profile_builders import point

    pts += [point(op, 0.3, H100) for op in decode]
    model = ProfileModel(synthetic_profile(H100, pts))
    q = Attention(id=0, batch=8, q_len=1, kv_len=2048, heads=32, kv_heads=8, head_dim=128)
    assert roofline_seconds(q, H100) / _quiet(model, q)[0] == pytest.approx(0.3)
    prefill = Attention(id=0, batch=8, q_len=2048, kv_len=2048, heads=32, kv_heads=8, head_dim=128)
    assert "not in the profile" in model.estimate(prefill, H100).detail


def test_host_time_comes_from_the_regime_then_the_aten_call() -> None:
    model = ProfileModel(synthetic_profile(H100))
    assert model.estimate(Gemm(id=0, m=3, n=4096, k=4096), H100).host_s == pytest.approx(30e-6)
    attn = Attention(id=0, batch=1, q_len=1, kv_len=64, heads=8, kv_heads=8, head_dim=64)
    assert model.estimate(attn, H100).host_s == pytest.approx(20e-6)


def test_launch_floor_under_the_smallest_measured_size() -> None:
    model = ProfileModel(synthetic_profile(H100))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        cost = model.estimate(Norm(id=0, rows=1, hidden=8), H100)
    assert cost.seconds == pytest.approx(2e-6) and cost.bound.value == "launch"


def test_profile_of_another_gpu_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a100.profile.json"
    synthetic_profile(H100, hardware="a100-80gb").save(path)
    model = resolve_cost_model(str(path))
    with pytest.raises(CostModelError, match=r"measured on 'a100-80gb'.*not 'h100-sxm'") as exc:
        model.estimate(Gemm(id=0, m=8, n=4096, k=4096), H100)
    assert str(path) in exc.value.one_line()
    unchecked = resolve_cost_model(str(path), check_hardware="false")
    assert unchecked.estimate(Gemm(id=0, m=8, n=4096, k=4096), H100).seconds > 0


@pytest.mark.parametrize(("version", "word"), [(0, "older"), (2, "newer")])
def test_other_schema_versions_are_one_line_errors(tmp_path: Path, version: int, word: str) -> None:
    path = tmp_path / "h.profile.json"
    raw = json.loads(synthetic_profile(H100).model_dump_json())
    path.write_text(json.dumps({**raw, "schema_version": version}))
    with pytest.raises(SchemaVersionError, match=word) as exc:
        load_profile(path)
    assert str(path) in exc.value.one_line() and "\n" not in exc.value.one_line()


def test_truncated_profile_names_the_file_and_the_parts_to_resume_from(tmp_path: Path) -> None:
    path = tmp_path / "h.profile.json"
    text = synthetic_profile(H100).model_dump_json()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(LoadError, match="truncated") as exc:
        load_profile(path)
    assert str(path) in exc.value.one_line() and "--resume" not in exc.value.one_line()
    (tmp_path / "h.profile.json.parts.jsonl").write_text("")
    with pytest.raises(LoadError) as exc2:
        load_profile(path)
    assert "--resume" in exc2.value.one_line()


def test_a_cost_table_is_not_a_profile(tmp_path: Path) -> None:
    path = tmp_path / "calib.profile.json"
    path.write_text(json.dumps({"format": "opgraph.cost_table", "schema_version": 1}))
    with pytest.raises(LoadError, match="not a device profile"):
        load_profile(path)


def _device(tmp_path: Path, name: str, profile: str | None) -> Path:
    line = f'profile = "{profile}"\n' if profile else ""
    toml = tmp_path / f"{name}.toml"
    toml.write_text(f'base = "h100"\nname = "{name}"\n{line}')
    return toml


def test_catalog_entry_names_its_profile_and_becomes_the_default(tmp_path: Path) -> None:
    hw = load_hardware(_device(tmp_path, "testgpu", "testgpu.profile.json"))
    synthetic_profile(hw).save(tmp_path / "testgpu.profile.json")
    assert hardware_profile(hw) == tmp_path / "testgpu.profile.json"
    model, note = default_cost_model(hw)
    assert isinstance(model, ProfileModel) and note is None
    op = Gemm(id=0, m=64, n=4096, k=4096)
    assert model.estimate(op, hw).seconds == pytest.approx(roofline_seconds(op, hw) / gemm_eff(64, 4096, 4096))
    # `-c profile` finds the device's profile too; `-c roofline` stays the datasheet model.
    assert resolve_cost_model("profile").estimate(op, hw).seconds == pytest.approx(model.estimate(op, hw).seconds)
    assert "profile" not in resolve_cost_model("roofline").estimate(op, hw).detail


def test_device_without_profile_is_uncalibrated(tmp_path: Path) -> None:
    hw = load_hardware(_device(tmp_path, "plaingpu", None))
    model, note = default_cost_model(hw)
    assert isinstance(model, RooflineModel)
    assert note is not None and "plaingpu is uncalibrated" in note and "\n" not in note
    assert "nor a host profile" in note  # its wall must not be compared with a calibrated device's
    with pytest.raises(CostModelError, match="ships no measured profile"):
        resolve_cost_model("profile").estimate(Gemm(id=0, m=8, n=64, k=64), hw)


def test_profile_key_must_be_a_file_name(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text('base = "h100"\nname = "bad"\nprofile = 3\n')
    with pytest.raises(LoadError, match="profile: expected a file name"):
        load_hardware(toml)


def test_efficiency_is_finite_for_every_measured_point() -> None:
    model = ProfileModel(synthetic_profile(H100))
    idx = model.index(H100)
    assert idx.skipped == 0
    assert all(math.isfinite(v) for r in idx.regimes.values() for g in r.groups for v in g.log_eff)


def test_hardware_option_reads_the_device_a_profile_was_measured_on(tmp_path: Path) -> None:
    path = tmp_path / "h.profile.json"
    synthetic_profile(H100).save(path)
    assert load_hardware(path).name == "h100-sxm"
    synthetic_profile(H100, hardware="").save(path)
    with pytest.raises(LoadError, match="names no catalog device"):
        load_hardware(path)


def _timed(op: OpBase, seconds: float) -> ProfilePoint:
    from tests.hardware.profile_builders import point

    return point(op, roofline_seconds(op, H100) / seconds, H100)


def test_memory_bound_shapes_only_a_twin_dtype_measured_stand_for_it() -> None:
    """Held-out Llama-1B fp16 decode: the fp16 sweep has three big GEMM shapes, so a 2048x512 k/v
    projection took their efficiency (1 us) where bf16 measured that very shape at 5.4 us (5.5 us measured
    in fp16). Memory-bound, a twin dtype's (same size and peaks) shape counts; compute-bound, its own."""
    small = [(512, 2048), (2048, 2048)]
    bf16 = gemm_points(H100, nks=(*NK_BIG, *small), eff=lambda m, n, k, dt: 0.1 if n * k < 2**23 else 0.8)
    fp16 = gemm_points(H100, nks=NK_BIG, dtype=DType.fp16, eff=lambda m, n, k, dt: 0.7)
    model = ProfileModel(synthetic_profile(H100, [*bf16, *fp16]))
    decode = Gemm(id=0, m=1, n=512, k=2048, dtype=DType.fp16)
    seconds, detail = _quiet(model, decode)
    assert roofline_seconds(decode, H100) / seconds == pytest.approx(0.1)
    assert "(bf16)" in detail
    prefill = Gemm(id=0, m=4096, n=8192, k=4096, dtype=DType.fp16)  # compute-bound: fp16's own shapes
    assert roofline_seconds(prefill, H100) / _quiet(model, prefill)[0] == pytest.approx(0.7)


NK_BIG = ((4096, 4096), (14336, 4096))


def test_under_the_smallest_measured_bytes_the_time_holds() -> None:
    """Held-out Llama-1B decode: RoPE of 8 KV heads (half the bytes of the smallest point) took the
    smallest point's efficiency, 2.5 us, where the kernels take 9 us as at the smallest measured size."""
    pts = [
        _timed(op, 9e-6 + roofline_seconds(op, H100) / 0.8)
        for op in (Norm(id=0, rows=r, hidden=4096) for r in (16, 256, 4096))
    ]
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *pts]))
    smallest = pts[0].seconds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        for rows in (8, 2):
            cost = model.estimate(Norm(id=0, rows=rows, hidden=4096), H100)
            assert cost.seconds == pytest.approx(smallest) and "under the smallest" in cost.detail


def test_a_latency_bound_neighbour_lends_its_time_not_its_efficiency() -> None:
    """Held-out Llama-1B decode: attention of head size 64 at batch 1 took the efficiency of head size 128
    (latency-bound, 8.8 us) over half the roofline, 3.4 us, where it takes 6.7 us."""
    heads = {"batch": 1, "q_len": 1, "heads": 32, "kv_heads": 8}
    lat = [Attention(id=0, kv_len=kv, head_dim=128, **heads) for kv in (128, 512, 2048)]
    bw = [Attention(id=0, kv_len=kv, head_dim=128, **{**heads, "batch": 32}) for kv in (128, 512, 2048)]
    pts = [_timed(op, 8e-6) for op in lat] + [_timed(op, roofline_seconds(op, H100) / 0.8) for op in bw]
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *pts]))
    d64 = Attention(id=0, kv_len=1024, head_dim=64, **heads)
    assert 7e-6 < _quiet(model, d64)[0] <= 8e-6  # mostly the time of its nearest shape (half of it before)
    d64_bw = Attention(id=0, kv_len=1024, head_dim=64, **{**heads, "batch": 32})
    assert roofline_seconds(d64_bw, H100) / _quiet(model, d64_bw)[0] == pytest.approx(0.8, rel=0.05)


def _variant_falls_back(
    plain: Callable[[int], OpBase], variant: Callable[[int], OpBase], sizes: tuple[int, ...], at: int, note: str
) -> ProfileModel:
    """A variant of a regime (its points at efficiency 0.25) is predicted from its own points; a profile
    without them predicts it from the plain regime's (0.5) and says so (``note``); the plain op keeps
    the plain points. Returns the profile with both."""
    base = [_timed(plain(t), roofline_seconds(plain(t), H100) / 0.5) for t in sizes]
    own = [_timed(variant(t), roofline_seconds(variant(t), H100) / 0.25) for t in sizes]
    op = variant(at)
    seconds, detail = _quiet(ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *base])), op)
    assert roofline_seconds(op, H100) / seconds == pytest.approx(0.5)
    assert note in detail
    both = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *base, *own]))
    assert roofline_seconds(op, H100) / _quiet(both, op)[0] == pytest.approx(0.25)
    assert roofline_seconds(op, H100) / _quiet(both, plain(at))[0] == pytest.approx(0.5)
    return both


def test_a_strided_input_is_its_own_regime_and_falls_back_to_the_contiguous_one_saying_so() -> None:
    """Held-out Mixtral prefill: the gated activation over the chunked gate_up ran 1.8x the contiguous
    kernel's time; a prefill's KV-cache write of a transposed view 3.5-6x."""
    from opgraph.ir import Activation, TensorSpec

    def act(tokens: int, chunked: bool) -> Activation:
        spec = TensorSpec(shape=(tokens, 4096), dtype=DType.bf16, strides=(8192, 1) if chunked else None)
        return Activation(id=0, fn="swiglu", gated=True, numel=tokens * 4096, hidden=4096, inputs=(spec,))

    both = _variant_falls_back(
        lambda t: act(t, False), lambda t: act(t, True), (16, 256, 4096), 1024,
        "no activation:swiglu:strided points, from activation:swiglu",
    )  # fmt: skip
    dense = TensorSpec(shape=(16, 1, 4096), dtype=DType.bf16, strides=(4096, 1, 1))  # size-1 dims aside: dense
    assert "strided" not in _quiet(both, act(16, False).model_copy(update={"inputs": (dense,)}))[1]


def test_a_gemm_over_unaligned_rows_is_its_own_regime_and_falls_back_saying_so() -> None:
    """Eager decodes: ``q @ K^T`` and the weights ``@ V`` over kv + 1 keys ran cuBLAS ``gemvx`` kernels
    about twice the time of the sweep's aligned points (77-90 us against 46 predicted, Qwen2.5 b4 kv4096)."""
    from hardware.models.profile import unaligned_gemm
    from opgraph.ir import TensorSpec

    def bmm(m: int, n: int) -> Gemm:
        return Gemm(id=0, m=m, n=n, k=128, batch=64)

    def eff(model: ProfileModel, op: Gemm) -> tuple[float, str]:
        seconds, detail = _quiet(model, op)
        return roofline_seconds(op, H100) / seconds, detail

    aligned = [_timed(bmm(m, 2048), roofline_seconds(bmm(m, 2048), H100) / 0.5) for m in (1, 16, 256)]
    own = [_timed(bmm(m, 2049), roofline_seconds(bmm(m, 2049), H100) / 0.25) for m in (1, 16, 256)]
    got, detail = eff(ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *aligned])), bmm(4, 2049))
    assert got == pytest.approx(0.5) and "no gemm:batched:unaligned points, from gemm:batched" in detail
    both = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *aligned, *own]))
    assert eff(both, bmm(4, 2049))[0] == pytest.approx(0.25) and eff(both, bmm(4, 2048))[0] == pytest.approx(0.5)
    assert unaligned_gemm(Gemm(id=0, m=1, n=128, k=4097, batch=8))  # the weights @ V: 4097 keys a row
    assert unaligned_gemm(Gemm(id=0, m=1, n=4097, k=128, dtype=DType.fp16))
    assert not unaligned_gemm(Gemm(id=0, m=1, n=4104, k=128))  # 8 bf16 elements: 16 bytes
    assert not unaligned_gemm(Gemm(id=0, m=64, n=2048, k=1, batch=8))  # RoPE's k = 1 products: vectors
    assert not unaligned_gemm(Gemm(id=0, m=3, n=4096, k=4096))  # rows of m are not a row length
    # gpt-oss's values matmul: weights [.., 2049] with the sink column sliced off: rows 2049 apart
    sliced = TensorSpec(shape=(64, 1, 2048), dtype=DType.bf16, strides=(2049, 2049, 1))
    assert unaligned_gemm(Gemm(id=0, m=1, n=64, k=2048, batch=64, inputs=(sliced,)))


def test_an_elementwise_op_by_a_scalar_reads_one_tensor_and_is_its_own_regime() -> None:
    """Eager attention's ``scores * scaling`` (Qwen2.5 b1 s2048: 159 us a layer) was priced 224 from the
    products of two tensors: its fields counted a second operand, and the kernel is another."""
    from opgraph.ir import Elementwise

    def mul(tokens: int, scalar: bool = False) -> Elementwise:
        return Elementwise(id=0, fn="mul", numel=tokens * 4096, hidden=4096, scalar=scalar)

    def eff(model: ProfileModel, op: Elementwise) -> tuple[float, str]:
        seconds, detail = _quiet(model, op)
        return roofline_seconds(op, H100) / seconds, detail

    assert roofline_seconds(mul(4096, True), H100) == pytest.approx(roofline_seconds(mul(4096), H100) * 2 / 3)
    sizes = (16, 256, 4096)
    plain = [_timed(mul(t), roofline_seconds(mul(t), H100) / 0.5) for t in sizes]
    own = [_timed(mul(t, True), roofline_seconds(mul(t, True), H100) / 0.8) for t in sizes]
    got, detail = eff(ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *plain])), mul(1024, True))
    assert got == pytest.approx(0.5) and "no elementwise:mul:scalar points, from elementwise:mul" in detail
    both = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *plain, *own]))
    assert eff(both, mul(1024, True))[0] == pytest.approx(0.8) and eff(both, mul(1024))[0] == pytest.approx(0.5)


def test_an_ungated_activation_the_profile_lacks_is_priced_from_an_ungated_one() -> None:
    """BLOOM's GELU computes a tanh: priced from the gated or strided activations' points (two inputs
    read), it was 3x long; an ungated activation's kernel reads one."""
    from opgraph.ir import Activation, TensorSpec

    def act(fn: str, tokens: int, gated: bool = False, chunked: bool = False) -> Activation:
        spec = TensorSpec(shape=(tokens, 4096), dtype=DType.bf16, strides=(8192, 1) if chunked else None)
        return Activation(id=0, fn=fn, gated=gated, numel=tokens * 4096, hidden=4096, inputs=(spec,))

    sizes = (16, 256, 4096, 16384)
    pts = [_timed(act("silu", t), roofline_seconds(act("silu", t), H100) / 0.8) for t in sizes]
    for effs, gated, chunked in ((0.3, True, False), (0.2, True, True), (0.25, True, True)):
        pts += [_timed(a, roofline_seconds(a, H100) / effs) for t in sizes if (a := act("swiglu", t, gated, chunked))]
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *pts]))
    op = act("tanh", 1024)
    seconds, detail = _quiet(model, op)
    assert roofline_seconds(op, H100) / seconds == pytest.approx(0.8)
    assert "no activation:tanh points, from activation:silu" in detail


def test_a_combine_with_float32_routing_weights_is_its_own_regime_and_falls_back_saying_so() -> None:
    """Held-out Mixtral prefill: its router keeps the routing weights in float32, so the combine weighs,
    gathers and sums in float32: 189 us at 2048 tokens where the bf16-weight points measured 110 us."""
    from opgraph.ir import MoeRouting, TensorSpec

    def combine(tokens: int, weights: DType) -> MoeRouting:
        w = TensorSpec(shape=(tokens * 2, 1), dtype=weights)
        return MoeRouting(id=0, fn="combine", tokens=tokens, experts=8, top_k=2, hidden=4096, inputs=(w,))

    assert combine(8, DType.fp32).weights_dtype is DType.fp32 and combine(8, DType.bf16).weights_dtype is DType.bf16
    _variant_falls_back(
        lambda t: combine(t, DType.bf16), lambda t: combine(t, DType.fp32), (8, 512, 8192), 2048,
        "no moe_routing:combine:weights_fp32 points, from moe_routing:combine",
    )  # fmt: skip


def test_the_sweep_measures_the_combine_as_mixtral_runs_it() -> None:
    from validators.profile import sweep_points

    fp32 = [p.op for p in sweep_points("cuda", kinds=("moe_routing",)) if "weights_fp32" in p.op.definition]
    assert {(op.experts, op.top_k) for op in fp32} == {(8, 2), (128, 8)}  # type: ignore[attr-defined]
    assert all(op.weights_dtype is DType.fp32 and op.fn == "combine" for op in fp32)  # type: ignore[attr-defined]
    assert len({op.tokens for op in fp32}) >= 6  # type: ignore[attr-defined]


def test_a_decode_is_placed_by_its_sequence_kv_head_pairs() -> None:
    """Held-out Qwen2.5-7B decode (batch 4, 4 KV heads: 16 pairs) took batch 8's efficiency of its head
    layout (32 pairs), 0.81 of the roofline where it ran at 0.61: a decode kernel's parallelism is
    batch x KV heads, not the two apart."""
    kvs = (512, 2048, 8192)
    few = [Attention(id=0, batch=1, q_len=1, kv_len=kv, heads=32, kv_heads=8, head_dim=128) for kv in kvs]
    many = [Attention(id=0, batch=8, q_len=1, kv_len=kv, heads=32, kv_heads=8, head_dim=128) for kv in kvs]
    pts = [_timed(op, roofline_seconds(op, H100) / 0.3) for op in few]
    pts += [_timed(op, roofline_seconds(op, H100) / 0.8) for op in many]
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *pts]))
    op = Attention(id=0, batch=8, q_len=1, kv_len=2048, heads=4, kv_heads=1, head_dim=128)  # 8 pairs, GQA 4
    assert roofline_seconds(op, H100) / _quiet(model, op)[0] == pytest.approx(0.3)


def test_a_dense_gemms_issue_time_is_the_dense_gemm_points_median_not_the_expert_loops() -> None:
    """The dense GEMM regime (``gemm``) and the GEMM kind share a name: an expert loop's host time (a
    whole loop of calls) must not enter the dense regime's median, only the kind's fallback."""
    import statistics

    from hardware.models.profile import profile_features

    path = hardware_profile(load_hardware("h100-sxm"))
    assert path is not None
    profile = load_profile(path)
    dense, family = [], []
    for p in profile.points:
        f = profile_features(p.op)
        if p.tag or f is None or p.host_s is None or f.family != "gemm":
            continue
        family.append(p.host_s)
        if f.regime == "gemm":
            dense.append(p.host_s)
    assert statistics.median(family) > statistics.median(dense)  # the loops' hundreds of us pull it up
    op = Gemm(id=0, m=8, n=4096, k=4096, dtype=DType.bf16)
    cost = ProfileModel(profile).estimate(op, load_hardware("h100-sxm"))
    assert cost.host_s == pytest.approx(statistics.median(dense))
