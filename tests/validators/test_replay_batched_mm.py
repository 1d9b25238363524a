"""The gemm recipe replays a ``batched_mm`` expert GEMM as transformers' ``batched_mm`` experts run it on
a CPU: the stacked expert weights gathered into one copy per token-expert pair, then one ``torch.bmm``
of the copies against the pairs' tokens, in the model's layout (weight first, or token first where the
model stores its weights transposed). Only the ``bmm`` is timed: the gather is a memory op of its own in
the captured graph."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replay_helpers import FAST  # noqa: E402

from opgraph.capture import capture  # noqa: E402
from opgraph.capture.moe_model import is_experts_module  # noqa: E402
from opgraph.ir import DType, Gemm, OpGraph, TensorSpec  # noqa: E402
from tests.opgraph.capture.test_capture_architectures import BASE, TINY  # noqa: E402
from validators import ReplayStatus, replay_op  # noqa: E402
from validators.recipes import BuildContext, RecipeSelector  # noqa: E402

Call = tuple[str, tuple[tuple[int, ...], ...]]


def _has_batched_mm() -> bool:
    from transformers.integrations import moe as hf_moe

    return hasattr(hf_moe, "batched_mm_experts_forward")


pytestmark = pytest.mark.skipif(
    not _has_batched_mm(), reason=f"transformers {transformers.__version__} has no batched_mm experts"
)


def _aten_calls(fn: Callable[[], Any], inside: Callable[[], bool] = lambda: True) -> list[Call]:
    """The aten calls ``fn`` makes (views aside), with the shapes of their tensor arguments."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[Call] = []
    views = {"view", "_unsafe_view", "unsqueeze", "squeeze", "expand", "t", "transpose", "select", "slice"}

    def shapes(args: Any) -> tuple[tuple[int, ...], ...]:
        flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else (x,))]
        return tuple(tuple(a.shape) for a in flat if isinstance(a, torch.Tensor))

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.__name__.split(".")[0]
            if name not in views and inside():
                seen.append((name, shapes(args)))
            return func(*args, **(kwargs or {}))

    with Calls():
        fn()
    return seen


def _config(tmp_path: Path, model_type: str) -> str:
    arch, extra = TINY[model_type]
    cfg = {**BASE, **extra, "model_type": model_type, "architectures": [arch], "experts_implementation": "batched_mm"}
    path = tmp_path / f"{model_type}_batched_mm.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _expert_gemms(g: OpGraph) -> list[Gemm]:
    return [o for o in g.ops if isinstance(o, Gemm) and o.target.startswith("moe_experts")]


def _ctx() -> BuildContext:
    return BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_the_replayed_bmm_is_the_one_transformers_runs(tmp_path: Path, model_type: str) -> None:
    # qwen3_moe stores its expert weights [n, k] (weight @ token), gpt_oss [k, n] (token @ weight).
    path = _config(tmp_path, model_type)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path)).eval()
    inside = [False]
    for m in model.modules():
        if is_experts_module(m):
            m.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
            m.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    ids = torch.arange(7).reshape(1, 7)
    with torch.no_grad():
        ran = [c for c in _aten_calls(lambda: model(ids), lambda: inside[0]) if c[0] == "bmm"]
    gemms = _expert_gemms(capture(model, device="cpu", seq_len=7, dtype="fp32"))
    assert len(gemms) == len(ran) > 0
    for op, want in zip(gemms, ran, strict=True):
        sel = RecipeSelector().select(op)
        assert sel.recipe is not None and sel.recipe.name == "gemm"
        case = sel.recipe.build(op, _ctx())
        assert _aten_calls(case) == [want], op.definition


def test_a_single_pair_runs_a_bmm_of_its_gathered_weight() -> None:
    # A top-1 decode token: one pair, one product, still a bmm (not an mm) of a gathered weight copy.
    bf16 = DType.bf16
    op = Gemm(
        id=0, m=1, n=96, k=64, batch=1, dtype=bf16, target="moe_experts_gate_up",
        definition="moe_batched_mm_e16_h64_i48_topk1_gate_up",
        inputs=(TensorSpec(shape=(1, 96, 64), dtype=bf16), TensorSpec(shape=(1, 64, 1), dtype=bf16)),
    )  # fmt: skip
    sel = RecipeSelector().select(op)
    assert sel.recipe is not None
    built: list[Any] = []
    calls = _aten_calls(lambda: built.append(sel.recipe.build(op, _ctx())))  # type: ignore[union-attr]
    # The pair's copy is gathered from all 16 experts' stacked weights by the routed id.
    assert [c for c in calls if c[0] == "index"] == [("index", ((16, 96, 64), (1,)))]
    assert _aten_calls(built[0]) == [("bmm", ((1, 96, 64), (1, 64, 1)))]


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_a_captured_batched_mm_gemm_replays_and_matches(tmp_path: Path, model_type: str) -> None:
    g = capture(_config(tmp_path, model_type), device="meta", phase="decode", batch=3, kv_len=8)
    for op in _expert_gemms(g)[:2]:
        r = replay_op(op, "cpu", FAST)
        assert r.status is ReplayStatus.OK, r.reason
        assert r.numerics is not None and r.numerics.ok and "batched_mm" in r.numerics.note


@pytest.mark.parametrize(("model_type", "experts_key", "inter_key"), [
    ("qwen3_moe", "num_experts", "moe_intermediate_size"),
    ("mixtral", "num_local_experts", "intermediate_size"),
])  # fmt: skip
def test_the_sweeps_batched_mm_point_is_the_gemm_capture_records(
    tmp_path: Path, model_type: str, experts_key: str, inter_key: str
) -> None:
    """The profile sweep's ``batched_mm`` series (``validators.profile.batched_mm_gemm``) builds, from an
    MoE layer's experts, top-k, hidden and expert sizes, the op capture records for a decode of that many
    token-expert pairs: the same replay config (one key), so the profile's points are the captured ops'."""
    from opgraph.ir.configs import config_key, normalise_op
    from validators.profile import batched_mm_gemm

    cfg = {**BASE, **TINY[model_type][1]}
    g = capture(_config(tmp_path, model_type), device="meta", phase="decode", batch=3, kv_len=8)
    gemms = _expert_gemms(g)
    assert {o.target for o in gemms} == {"moe_experts_gate_up", "moe_experts_down"}
    for op in gemms:
        part = "gate_up" if op.definition.endswith("gate_up") else "down"
        assert op.batch == 3 * cfg["num_experts_per_tok"]
        built = batched_mm_gemm(
            part, op.batch, cfg[experts_key], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg[inter_key]
        )
        assert config_key(built) == config_key(normalise_op(op)), op.definition


def test_a_sweep_point_of_the_batched_mm_series_replays_on_the_cpu() -> None:
    """The smallest point of the GPU sweep's ``batched_mm`` series (Qwen3-30B-A3B's down, one pair) replays
    through the gemm recipe, as transformers runs it, and checks against its reference."""
    from validators.profile import sweep_points

    series = [p for p in sweep_points("cuda") if p.series.endswith(".batched_mm")]
    p = min(series, key=lambda q: q.op.total_bytes)
    assert isinstance(p.op, Gemm) and (p.op.batch, p.op.n, p.op.k) == (1, 2048, 768)
    r = replay_op(p.op, "cpu", FAST, warm_inputs=p.warm_inputs)
    assert r.status is ReplayStatus.OK, r.reason
    assert r.numerics is not None and r.numerics.ok and "batched_mm: torch.bmm over 1 gathered" in r.numerics.note
