"""The profile sweep: what it covers, its order, streaming, resume, budget, and the CLI (CPU)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hardware import DeviceProfile, ProfileExtrapolationWarning, ProfileModel, load_hardware, load_profile
from hardware.models.profile import profile_features
from hardware.profile import ProfileDevice, ProfilePoint
from opgraph.cli.app import app
from opgraph.ir import Attention, DType, Gemm, OpBase, OpKind, load_graph
from opgraph.ir.configs import config_key
from validators.configs import OpConfig
from validators.profile import (
    PASS_MARK,
    ProfileError,
    SweepPoint,
    coarse_to_fine,
    finish_profile,
    fold_passes,
    guess_hardware,
    power_bound,
    profile_from_parts,
    profile_from_replays,
    repeat_plan,
    run_profile,
    sweep_key,
    sweep_points,
    sweep_timing,
)
from validators.replay import Replayer
from validators.results import ReplayResult

GRAPH = Path(__file__).resolve().parents[1] / "data" / "h100" / "llama-3.2-1b-l2-prefill256.graph.json.gz"


def _few(n: int = 4) -> list[SweepPoint]:
    return sweep_points("cpu")[:n]


def test_gpu_sweep_spans_the_regimes_models_reach() -> None:
    pts = sweep_points("cuda")
    gemm_m = {p.op.m for p in pts if isinstance(p.op, Gemm) and p.op.groups == 1 and p.op.batch == 1}
    assert min(gemm_m) == 1 and max(gemm_m) == 16384
    dtypes = {p.op.dtype for p in pts if isinstance(p.op, Gemm)}
    assert dtypes == {DType.bf16, DType.fp16, DType.fp32}
    regimes = {f.regime for p in pts if (f := profile_features(p.op)) is not None}
    for needed in (
        "gemm", "gemm:grouped:bmm", "gemm:grouped:loop", "attention:decode", "attention:prefill",
        "attention:masked", "attention:full", "norm:rms", "rope", "activation:swiglu", "elementwise:add",
        "softmax", "memory:copy", "memory:cat", "memory:kv_cache_write", "embedding", "moe_routing:route",
        "moe_routing:dispatch", "moe_routing:combine",
    ):  # fmt: skip
        assert needed in regimes, needed
    attn = [p.op for p in pts if isinstance(p.op, Attention)]
    assert {a.heads // a.kv_heads for a in attn} >= {1, 4, 7, 8} and any(a.window for a in attn)
    assert sum(p.tag == "launch" for p in pts) >= 1
    assert len({p.key for p in pts}) == len(pts)


def test_sweep_order_covers_every_kind_before_refining_any() -> None:
    pts = sweep_points("cuda")
    first = [p for p in pts if p.level == 0]
    assert pts[: len(first)] == first
    kinds = {getattr(p.op, "kind") for p in first}  # noqa: B009
    assert kinds >= {OpKind.GEMM, OpKind.ATTENTION, OpKind.NORM, OpKind.ROPE, OpKind.ACTIVATION, OpKind.MEMORY}
    # Within a series the ends come before the middle.
    series = [p for p in pts if p.series == "gemm.llama8b.q_o"]
    assert [getattr(p.op, "m") for p in series[:2]] == [1, 16384]  # noqa: B009


def test_coarse_to_fine_levels() -> None:
    assert coarse_to_fine(1) == [0]
    assert coarse_to_fine(9) == [0, 3, 2, 3, 1, 3, 2, 3, 0]


def test_guess_hardware_from_driver_names() -> None:
    assert guess_hardware("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert guess_hardware("NVIDIA H100 PCIe") == "h100-pcie"
    assert guess_hardware("NVIDIA H200") == "h200"
    assert guess_hardware("Some Other Accelerator") == ""


def test_cpu_sweep_streams_points_and_writes_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.profile.json"
    seen: list[str] = []
    prof = run_profile(out, "cpu", points=_few(), hardware="h100", on_point=lambda i, n, sp, r: seen.append(sp.key))
    assert prof.complete and len(prof.points) == 4 and prof.device.hardware == "h100-sxm"
    assert load_profile(out) == prof
    lines = (tmp_path / "cpu.profile.json.parts.jsonl").read_text().splitlines()
    assert "header" in json.loads(lines[0]) and [json.loads(x)["key"] for x in lines[1:]] == seen
    assert prof.launch_us is not None and prof.launch_us > 0  # the first CPU point is the launch kernel


def test_resume_skips_done_points_and_a_cut_last_line(tmp_path: Path) -> None:
    out = tmp_path / "p.profile.json"
    pts = _few(4)
    run_profile(out, "cpu", points=pts[:3])
    parts = tmp_path / "p.profile.json.parts.jsonl"
    text = parts.read_text()
    parts.write_text(text[: len(text) - 40])  # the third point's line cut, as a kill leaves it
    again: list[tuple[str, bool]] = []
    prof = run_profile(
        out, "cpu", points=pts, resume=True, on_point=lambda i, n, sp, r: again.append((sp.key, r is None))
    )
    assert [done for _, done in again] == [True, True, False, False]
    assert prof.complete and len(prof.points) == 4
    assert any("unreadable line" in n for n in prof.notes)


def test_resume_refuses_parts_of_another_device(tmp_path: Path) -> None:
    out = tmp_path / "p.profile.json"
    parts = tmp_path / "p.profile.json.parts.jsonl"
    parts.write_text(json.dumps({"header": {"name": "NVIDIA H100 80GB HBM3"}}) + "\n")
    with pytest.raises(ProfileError, match="measured on 'NVIDIA H100 80GB HBM3'"):
        run_profile(out, "cpu", points=_few(2), resume=True)


def test_budget_stops_cleanly_with_a_valid_incomplete_profile(tmp_path: Path) -> None:
    out = tmp_path / "b.profile.json"
    prof = run_profile(out, "cpu", points=_few(3), budget_s=1e-9)
    assert not prof.complete and prof.planned == 3 and prof.points == ()
    assert "stopped at the time budget" in prof.notes[0]
    assert isinstance(load_profile(out), DeviceProfile)


def test_profile_from_parts_rebuilds_a_truncated_profile(tmp_path: Path) -> None:
    out = tmp_path / "t.profile.json"
    pts = _few(3)
    run_profile(out, "cpu", points=pts)
    out.write_text(out.read_text()[:100])
    prof = profile_from_parts(out, pts, sweep_timing("cpu"))
    assert len(prof.points) == 3 and load_profile(out) == prof


def _cli(*args: str | Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.output


def test_cli_profile_cpu(tmp_path: Path) -> None:
    out = tmp_path / "c.profile.json"
    code, text = _cli("profile", "--device", "cpu", "-o", out, "--max-points", "3", "-q", "-H", "h100")
    assert code == 0, text
    flat = " ".join(text.split())
    assert "3 points of 3 planned, complete" in flat
    assert re.search(r"this run took \d+ s", flat), flat  # how long the sweep measured, for its budget
    assert len(load_profile(out).points) == 3
    code, text = _cli("profile", "--device", "cpu", "-o", out, "--plan")
    assert code == 0 and f"{len(sweep_points('cpu'))} points" in text


def test_cli_profile_plan_needs_no_output_and_prints_tags_and_sizes() -> None:
    code, text = _cli("profile", "--device", "cpu", "--plan")
    assert code == 0, text
    lines = text.splitlines()
    assert "[launch]" in lines[0]  # printed as text, not eaten as rich markup
    gemm = [ln.split()[-1] for ln in lines if " gemm.256 " in ln]
    assert gemm == ["m=1", "m=128", "m=16"]  # the size along the series tells the rows apart
    assert any(ln.endswith("q_len=128 kv_len=128") for ln in lines)
    code, text = _cli("profile", "--device", "cpu")
    assert code == 2 and text.startswith("error: -o/--out:") and len(text.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--kinds", "gemm,nope"], "--kinds"),
        (["--budget-s", "0"], "--budget-s"),
        (["--max-points", "0"], "--max-points"),
        (["-H", "no-such-gpu"], "no-such-gpu"),
    ],
)
def test_cli_profile_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], where: str) -> None:
    code, text = _cli("profile", "--device", "cpu", "-o", tmp_path / "x.profile.json", *args)
    assert code == 2
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and where in lines[0]


def test_cli_from_parts_without_parts_is_a_one_line_error(tmp_path: Path) -> None:
    code, text = _cli("profile", "-o", tmp_path / "x.profile.json", "--from-parts")
    assert code == 2 and "no parts file" in text


@pytest.mark.skipif(not GRAPH.exists(), reason="tests/data/h100 graph absent")
def test_simulate_with_a_device_that_ships_a_profile(tmp_path: Path) -> None:
    from hardware import cost_graph
    from tests.hardware.profile_builders import gemm_points, norm_points, synthetic_profile

    toml = tmp_path / "testgpu.toml"
    toml.write_text('base = "h100"\nname = "testgpu"\nprofile = "testgpu.profile.json"\n')
    hw = load_hardware(toml)
    synthetic_profile(hw, [*gemm_points(hw, nks=((2048, 2048), (8192, 2048), (2048, 8192))), *norm_points(hw)]).save(
        tmp_path / "testgpu.profile.json"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        code, text = _cli("simulate", GRAPH, "-H", toml, "-c", "profile", "--json", "--skip-uncosted")
    assert code == 0, text
    stats = json.loads(text[text.index("{") :])
    graph = load_graph(GRAPH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        expected = cost_graph(graph, ProfileModel(tmp_path / "testgpu.profile.json"), hw).total_seconds * 1e6
    assert stats["serial_us"] == pytest.approx(expected, rel=1e-6)
    code, text = _cli("simulate", GRAPH, "-H", toml, "-c", "roofline", "--json", "--skip-uncosted")
    assert code == 0 and json.loads(text[text.index("{") :])["serial_us"] != pytest.approx(expected, rel=1e-3)
    code, text = _cli("simulate", GRAPH, "-H", "a6000", "-c", "profile")
    assert code == 2 and "a6000 ships no measured profile" in text


REPLAYS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu" / "h100"


@pytest.mark.skipif(not (REPLAYS / "llama8b_prefill2048.replay.jsonl").exists(), reason="committed H100 replays absent")
def test_profile_from_replays_reproduces_each_measured_config() -> None:
    from validators import load_results

    results = load_results(REPLAYS / "llama8b_prefill2048.replay.jsonl")
    prof = profile_from_replays(results)
    assert prof.device.hardware == "h100-sxm" and len(prof.points) == len(
        {r.key for r in results if r.status.value == "ok"}
    )
    model = ProfileModel(prof)
    hw = load_hardware("h100")
    for p in prof.points:
        assert model.estimate(p.op, hw).seconds == pytest.approx(p.seconds, rel=1e-9), p.op.definition


def test_sweep_measures_the_strided_layouts_models_run_and_replays_them_strided(tmp_path: Path) -> None:
    """Held-out Mixtral prefill: the gated activation over the chunked gate_up (339 us against 191 us of
    the contiguous points) and every prefill's KV-cache write of a transposed view (3.5-6x the contiguous
    points) are kernels the sweep never ran. It runs them now, under their own regimes, laid out as
    captured, and ``series`` picks them alone (to add them to a profile)."""
    only = sweep_points("cuda", series=("act.swiglu.chunked", "mem.kv_write.strided"))
    regimes = {f.regime for p in only if (f := profile_features(p.op)) is not None}
    assert regimes == {"activation:swiglu:strided", "memory:kv_cache_write:strided"}
    assert {p.key for p in only} <= {p.key for p in sweep_points("cuda")}
    small = [
        next(p for p in only if p.op.kind is kind and p.op.total_bytes < 1 << 20)
        for kind in (OpKind.ACTIVATION, OpKind.MEMORY)
    ]
    kinds = {p.op.kind for p in small}
    assert kinds == {OpKind.ACTIVATION, OpKind.MEMORY}
    import torch

    from validators.recipes import BuildContext, RecipeSelector

    for p in small:
        recipe = RecipeSelector().select(p.op).recipe
        assert recipe is not None
        case = recipe.build(p.op, BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0)))
        assert not all(t.is_contiguous() for t in case.inputs if isinstance(t, torch.Tensor) and t.numel())


def test_sweep_measures_unaligned_gemvs_and_strided_copies_in_the_models_layouts() -> None:
    """An eager decode's two batched GEMVs over kv + 1 keys (rows not 16-byte aligned: cuBLAS runs other
    kernels, about twice the aligned points' time on an H100) and the copies that read or write through
    strided views (a transposed tensor made contiguous, MLA's key assembly) have points of their own
    regimes, replayed as the models lay them out."""
    import torch

    from validators.recipes import BuildContext, RecipeSelector

    pts = sweep_points("cuda")
    unaligned = [p for p in pts if p.series.startswith(("gemm.eager_scores.", "gemm.eager_values.")) and
                 p.series.endswith(("kv513", "kv2049", "kv8193"))]  # fmt: skip
    assert len(unaligned) == 68
    assert {profile_features(p.op).regime for p in unaligned} == {"gemm:batched:unaligned"}
    copies = [p for p in pts if p.series.startswith("mem.copy.")]
    assert {p.series for p in copies} == {"mem.copy.transposed", "mem.copy.mla_nope", "mem.copy.mla_rope"}
    assert {profile_features(p.op).regime for p in copies} == {"memory:copy:strided", "memory:copy:broadcast"}
    rows = {profile_features(p.op).regime for p in pts if p.series.startswith(("softmax.", "red.", "mem.cat.sinks"))}
    assert {"softmax:unaligned", "reduction:max:unaligned", "memory:cat:unaligned"} <= rows
    strided = (".broadcast.", "sinks_")
    broadcast = {p.series: profile_features(p.op).regime for p in pts if any(t in p.series for t in strided)}
    assert broadcast == {
        "ew.broadcast.add": "elementwise:add:broadcast",
        "ew.broadcast.sub": "elementwise:sub:broadcast",
        "mem.cat.sinks_expanded": "memory:cat:broadcast",
    }
    ctx = BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    scores = min((p for p in unaligned if "scores" in p.series), key=lambda p: p.op.total_bytes).op
    case = RecipeSelector().select(scores).recipe.build(scores, ctx)  # type: ignore[union-attr]
    keys = case.inputs[1]
    assert keys.shape == (scores.batch, scores.k, scores.n) and keys.stride()[1] == 1  # K^T: a transposed view
    rope = min((p for p in copies if p.series == "mem.copy.mla_rope"), key=lambda p: p.op.total_bytes).op
    case = RecipeSelector().select(rope).recipe.build(rope, ctx)  # type: ignore[union-attr]
    dst, src = case.inputs
    assert not dst.is_contiguous() and src.stride()[1] == 0  # into a slice, from one head broadcast
    case.run(case.inputs, False)
    assert torch.equal(dst, src.expand_as(dst))


def test_sweep_measures_scalar_operands_narrowing_casts_and_an_alibi_addend() -> None:
    """What eager attention runs that the sweep priced from other kernels: a scale by a Python number (one
    tensor read), the cast of float32 probabilities back to half width (the sweep's large casts widened),
    a softmax of half scores in float32, and BLOOM's alibi copied into the scores expanded over the queries;
    each replays on the CPU."""
    import torch

    from validators.recipes import BuildContext, RecipeSelector

    pts = sweep_points("cuda")
    scalar = {p.series: profile_features(p.op).regime for p in pts if ".scalar." in p.series}
    assert scalar == {
        "ew.scalar.mul": "elementwise:mul:scalar",
        "ew.scalar.add": "elementwise:add:scalar",
        "ew.scores.scalar.mul": "elementwise:mul:scalar",
        "ew.fp32.scalar.mul": "elementwise:mul:scalar",
    }
    narrow = [p.op for p in pts if p.series == "mem.cast.narrow"]
    assert max(op.numel for op in narrow) == 2**28  # up to the scores of an eager prefill
    assert {(op.dtype, op.outputs[0].dtype) for op in narrow} == {(DType.fp32, DType.bf16)}
    half = {profile_features(p.op).regime for p in pts if p.series.startswith("softmax.half_to_float.")}
    assert half == {"softmax:half_to_float", "softmax:half_to_float:masked"}
    masked = [p.op for p in pts if ".masked." in p.series and p.series.startswith("softmax.")]
    assert {profile_features(op).regime for op in masked} == {"softmax:half_to_float:masked", "softmax:masked"}
    addend = [p.op for p in pts if p.series == "mem.addend"]
    assert {profile_features(op).regime for op in addend} == {"memory:addend:broadcast"}
    baddbmm = [p.op for p in pts if p.series.startswith("gemm.baddbmm.")]
    assert len(baddbmm) == 6 and {profile_features(op).regime for op in baddbmm} == {"gemm:batched:accumulate"}
    ctx = BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    smallest = min((p.op for p in pts if p.series.startswith("softmax.half_to_float.")), key=lambda o: o.total_bytes)
    for op in (min(addend, key=lambda o: o.numel), min(narrow, key=lambda o: o.numel), smallest):
        case = RecipeSelector().select(op).recipe.build(op, ctx)  # type: ignore[union-attr]
        case.run(case.inputs, False)
    softmax = min(masked, key=lambda o: o.total_bytes)
    case = RecipeSelector().select(softmax).recipe.build(softmax, ctx)  # type: ignore[union-attr]
    (x,) = case.inputs
    rows = x.view(-1, x.shape[-1])
    low = torch.finfo(x.dtype).min
    assert (rows[0, 1:] == low).all() and rows[0, 0] != low and (rows[x.shape[-1] - 1] != low).all()  # causal
    gemm = min(baddbmm, key=lambda o: o.total_bytes)
    case = RecipeSelector().select(gemm).recipe.build(gemm, ctx)  # type: ignore[union-attr]
    a, b, c = case.inputs
    expected = torch.baddbmm(c, a, b)
    assert case.run(case.inputs, False) is c and torch.equal(c, expected)  # in place, onto the scores
    case = RecipeSelector().select(addend[0]).recipe.build(addend[0], ctx)  # type: ignore[union-attr]
    src, dst = case.inputs
    assert src.stride()[2] == 0 and dst.is_contiguous()  # the alibi over the queries, into the scores
    case.run(case.inputs, False)
    assert torch.equal(dst, src.expand_as(dst))


BATCHED_MM_SERIES = {
    f"moe.{name}.{part}.batched_mm" for name in ("qwen3moe", "mixtral") for part in ("gate_up", "down")
}


def test_sweep_measures_batched_mm_experts_over_the_pairs() -> None:
    """transformers' opt-in ``batched_mm`` experts (one bmm of a gathered weight copy per token-expert
    pair) get a series per MoE layer and expert GEMM, over the pairs from a top-1 decode token to a short
    prefill, short of copies past 16 GiB; at a low priority, after every regime's coarse points."""
    from validators.recipes import RecipeSelector
    from validators.recipes.gemm import is_batched_mm

    pts = sweep_points("cuda")
    new = [p for p in pts if p.series in BATCHED_MM_SERIES]
    assert {p.series for p in new} == BATCHED_MM_SERIES
    pairs = {s: sorted(p.op.batch for p in new if p.series == s) for s in BATCHED_MM_SERIES}
    grid = [1, 2, 4, 8, 32, 128, 512, 2048]
    assert pairs["moe.qwen3moe.gate_up.batched_mm"] == pairs["moe.qwen3moe.down.batched_mm"] == grid
    assert pairs["moe.mixtral.gate_up.batched_mm"] == grid[:5]  # 235 MB a pair's copy: 128 pairs is 30 GB
    assert pairs["moe.mixtral.down.batched_mm"] == grid[:6]
    for p in new:
        op = p.op
        assert isinstance(op, Gemm) and op.m == 1 and is_batched_mm(op)
        f = profile_features(op)
        assert f is not None and f.regime == "gemm:grouped:batched_mm" and f.axis == "pairs"
        assert op.inputs[0].shape == (op.batch, op.n, op.k) and op.inputs[1].shape == (op.batch, op.k, 1)
        assert p.warm_inputs == (1,)  # the pairs' tokens are activations; the weight copies are not
        sel = RecipeSelector().select(op)
        assert sel.recipe is not None and sel.recipe.name == "gemm"
        assert p.level >= 2  # as the expert loop's series
    coarse = max(i for i, p in enumerate(pts) if p.level < 2)
    assert min(pts.index(p) for p in new) > coarse
    assert len(new) == 27 and len({p.key for p in pts}) == len(pts)


@pytest.mark.parametrize("device", ["h100-sxm", "h200"])
def test_the_batched_mm_series_leaves_the_shipped_points_keys(device: str) -> None:
    """A resumed sweep (``benchmarks/gpu/profile_resume.sh``, which keys the shipped points as the sweep
    keys them) measures the new series and nothing the profile holds: the plan less the series is the
    shipped profile's points. A point whose recorded name is the IR's earlier default spelling of it
    (the window of a prefill that the window does not reach, no longer named since e34a7ae) counts
    under the name the IR gives it now; names the sweep sets itself must match as they are."""
    from hardware.models.profile import BATCHED_MM, profile_points

    profile = load_profile(Path(__file__).resolve().parents[2] / "hardware" / "catalog" / f"{device}.profile.json")
    plan = {p.key for p in sweep_points("cuda") if p.series not in BATCHED_MM_SERIES}
    own = {p.key for p in profile_points(profile, BATCHED_MM)}
    shipped = set()
    for p in profile.points:
        if p.key in own:
            continue
        key = sweep_key(p)
        if key not in plan and p.op.definition != p.op.default_definition():
            key = sweep_key(
                p.model_copy(update={"op": p.op.model_copy(update={"definition": p.op.default_definition()})})
            )
        shipped.add(key)
    assert shipped == plan


def test_cli_profile_plan_lists_the_batched_mm_series() -> None:
    code, text = _cli("profile", "--device", "cpu", "--plan")
    assert code == 0, text
    tiny = [ln.split()[-1] for ln in text.splitlines() if " moe.tiny.gate_up.batched_mm " in ln]
    assert sorted(tiny) == ["batch=1", "batch=16"]
    code, text = _cli("profile", "--device", "cuda", "--plan", "--kinds", "gemm")
    assert code == 0, text
    for series in BATCHED_MM_SERIES:
        sizes = {ln.split()[-1] for ln in text.splitlines() if f" {series} " in ln}
        assert {"batch=1", "batch=2", "batch=32"} <= sizes, series
    assert " batch=2048" in text


# -- several passes over the power-bound points -------------------------------------------------------


def _gemm(m: int, n: int, k: int) -> Gemm:
    """A bf16 GEMM as the sweep builds one (FLOPs and bytes from its shapes)."""
    return next(p.op for p in sweep_points("cuda") if isinstance(p.op, Gemm)).model_copy(
        update={"m": m, "n": n, "k": k, "flops": 2 * m * n * k, "bytes_read": 2 * (m * k + n * k),
                "bytes_written": 2 * m * n, "definition": f"gemm_n{n}_k{k}"}
    )  # fmt: skip


def _measured(op: OpBase, us: float, *, tag: str = "", passes: tuple[float, ...] = ()) -> ProfilePoint:
    return ProfilePoint(key=config_key(op), op=op, seconds=us * 1e-6, tag=tag, passes=passes)


def test_power_bound_points_are_the_compute_bound_ones_worth_a_pass() -> None:
    h100 = load_hardware("h100")
    big = _gemm(2048, 28672, 8192)  # ~1 ms, 1500 FLOP/byte
    decode = _gemm(8, 28672, 8192)  # weight streaming: memory-bound
    small = _gemm(256, 256, 256)
    assert power_bound(_measured(big, 1200.0), h100)
    assert not power_bound(_measured(decode, 300.0), h100)
    assert not power_bound(_measured(small, 5.0), h100)  # under REPEAT_MIN_S
    assert not power_bound(_measured(big, 1200.0, tag="launch"), h100)
    assert power_bound(_measured(decode, 300.0), None)  # no catalog device: every long point


def test_repeat_plan_alternates_order_and_skips_points_that_hold_their_passes() -> None:
    pts = [SweepPoint(_gemm(m, 8192, 8192), "s") for m in (2048, 4096, 8192)]
    done = {sp.key: _measured(sp.op, 1000.0) for sp in pts}
    plan = repeat_plan(pts, done, load_hardware("h100"), passes=3)
    keys = [sp.key for sp in pts]
    assert [k for k, _ in plan] == [f"{k}{PASS_MARK}2" for k in keys[::-1]] + [f"{k}{PASS_MARK}3" for k in keys]
    done[keys[0]] = _measured(pts[0].op, 1000.0, passes=(1e-3, 1.1e-3, 0.9e-3))
    assert keys[0] not in {sp.key for _, sp in repeat_plan(pts, done, load_hardware("h100"), passes=3)}
    assert repeat_plan(pts, done, load_hardware("h100"), passes=1) == []


def test_fold_passes_keeps_the_median_and_every_pass_in_order() -> None:
    op = _gemm(2048, 8192, 8192)
    key = config_key(op)
    first = _measured(op, 1000.0).model_copy(update={"samples": 3, "sm_clock_mhz": 1980.0})
    folded = fold_passes(
        {
            key: first,
            f"{key}{PASS_MARK}3": _measured(op, 900.0).model_copy(update={"samples": 5, "sm_clock_mhz": 1410.0}),
            f"{key}{PASS_MARK}2": _measured(op, 1300.0).model_copy(update={"samples": 3, "sm_clock_mhz": 1500.0}),
            f"other{PASS_MARK}2": _measured(op, 5.0),  # a later pass of a point never measured: dropped
        }
    )
    assert list(folded) == [key]
    p = folded[key]
    assert p.passes == pytest.approx((1000e-6, 1300e-6, 900e-6)) and p.seconds == pytest.approx(1000e-6)
    assert p.samples == 11 and p.sm_clock_mhz == 1500.0


class _PassReplayer(Replayer):
    """A CPU replayer whose n-th measurement of a config reports ``TIMES[n]`` microseconds."""

    TIMES = (100.0, 130.0, 90.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {}

    def replay(self, cfg: OpConfig, *, moe_skew: float = 0.0) -> ReplayResult:
        r = super().replay(cfg, moe_skew=moe_skew)
        n = self.calls.get(cfg.key, 0)
        self.calls[cfg.key] = n + 1
        assert r.timing is not None
        return r.model_copy(update={"timing": r.timing.model_copy(update={"median_us": self.TIMES[n]})})


def test_sweep_measures_power_bound_points_in_three_passes_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("validators.profile.Replayer", _PassReplayer)
    out = tmp_path / "p.profile.json"
    pts = _few(4)
    seen: list[tuple[int, int, bool]] = []
    prof = run_profile(out, "cpu", points=pts, passes=3, on_point=lambda i, n, sp, r: seen.append((i, n, r is None)))
    # No catalog device on the CPU: every point of 50 us or more but the launch kernel is power-bound.
    repeated = [sp for sp in pts if sp.tag != "launch"]
    assert len(seen) == len(pts) + 2 * len(repeated) and seen[-1][:2] == (len(seen), len(seen))
    by_key = {p.key: p for p in prof.points}
    for sp in repeated:
        assert by_key[sp.key].passes == pytest.approx((100e-6, 130e-6, 90e-6))
        assert by_key[sp.key].seconds == pytest.approx(100e-6)
    assert all(not p.passes for p in prof.points if p.tag == "launch")
    assert prof.complete and prof.timing["passes"] == 3 and load_profile(out) == prof
    keys = [json.loads(x)["key"] for x in (tmp_path / "p.profile.json.parts.jsonl").read_text().splitlines()[1:]]
    second = [k.removesuffix(f"{PASS_MARK}2") for k in keys if k.endswith(f"{PASS_MARK}2")]
    assert second == [sp.key for sp in repeated][::-1]  # the second pass runs backwards
    again: list[bool] = []
    resumed = run_profile(
        out, "cpu", points=pts, passes=3, resume=True, on_point=lambda i, n, sp, r: again.append(r is None)
    )
    assert resumed.points == prof.points and resumed.timing == prof.timing  # the provenance's date is the resume's
    assert again == [True] * len(seen)  # every pass of every point done: nothing measured
    # Killed before its third pass: a resume measures only what is left.
    parts = tmp_path / "p.profile.json.parts.jsonl"
    kept = [
        ln for ln in parts.read_text().splitlines() if not ln.startswith(f'{{"key":"{repeated[0].key}{PASS_MARK}3"')
    ]
    assert len(kept) == len(keys)
    parts.write_text("\n".join(kept) + "\n")
    measured: list[str] = []

    def record(i: int, n: int, sp: SweepPoint, r: ReplayResult | None) -> None:
        if r is not None:
            measured.append(sp.key)

    run_profile(out, "cpu", points=pts, passes=3, resume=True, on_point=record)
    assert measured == [repeated[0].key]


def test_a_budget_stop_in_the_later_passes_says_so() -> None:
    info = ProfileDevice(name="x")
    op = _gemm(2048, 8192, 8192)
    sp = SweepPoint(op, "s")
    prof = finish_profile([sp], {sp.key: _measured(op, 1000.0)}, {sp.key}, info, sweep_timing("cpu"), stopped=True,
                          passes=3, repeats_left=2)  # fmt: skip
    assert prof.complete and "2 later-pass measurement(s)" in prof.notes[0]


def test_cli_profile_passes_must_be_positive(tmp_path: Path) -> None:
    code, text = _cli("profile", "--device", "cpu", "-o", tmp_path / "x.profile.json", "--passes", "0")
    assert code == 2 and text.startswith("error: --passes:") and len(text.strip().splitlines()) == 1


def test_cli_profile_plan_tells_the_later_passes_on_a_gpu() -> None:
    code, text = _cli("profile", "--device", "cuda", "--plan")
    assert code == 0 and text.splitlines()[-1].startswith("then 2 more pass(es) over the points measured compute-bound")
    code, text = _cli("profile", "--device", "cuda", "--plan", "--passes", "1")
    assert code == 0 and text.splitlines()[-1] == f"{len(sweep_points('cuda'))} points"
