"""transformers' ``batched_mm`` experts (``"experts_implementation": "batched_mm"``) gather each
token-expert pair's expert weights and run one ``bmm`` per projection over the pairs, each pair's token
against its own weight copy: the capture holds, per projection, a ``Gemm`` of ``batch`` = pairs, ``m`` = 1
and the projection's ``n``/``k`` (the definition naming the real intermediate size), fed by the weight
gather (a memory op), with the FLOPs and bytes of the ``bmm`` transformers runs on a CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from opgraph.capture import capture  # noqa: E402
from opgraph.capture.moe_model import is_experts_module  # noqa: E402
from opgraph.ir import OpGraph  # noqa: E402
from opgraph.ir.ops import Gemm, Memory  # noqa: E402
from tests.opgraph.capture.test_capture_architectures import BASE, TINY  # noqa: E402

BF16 = 2  # bytes per element


def _has_batched_mm() -> bool:
    from transformers.integrations import moe as hf_moe

    return hasattr(hf_moe, "batched_mm_experts_forward")


pytestmark = pytest.mark.skipif(
    not _has_batched_mm(), reason=f"transformers {transformers.__version__} has no batched_mm experts"
)


def _config(tmp_path: Path, model_type: str) -> tuple[str, dict[str, Any]]:
    """A tiny config of ``model_type`` whose experts run transformers' ``batched_mm``; its path and values."""
    arch, extra = TINY[model_type]
    cfg = {**BASE, **extra, "model_type": model_type, "architectures": [arch], "experts_implementation": "batched_mm"}
    path = tmp_path / f"{model_type}_batched_mm.json"
    path.write_text(json.dumps(cfg))
    return str(path), cfg


def _expert_gemms(g: OpGraph) -> list[Gemm]:
    return [o for o in g.ops if isinstance(o, Gemm) and o.target.startswith("moe_experts")]


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "gpt_oss"])
@pytest.mark.parametrize(("phase", "tokens"), [("prefill", 12), ("decode", 3)])
def test_a_batched_mm_expert_gemm_is_one_product_per_token_expert_pair(
    tmp_path: Path, model_type: str, phase: str, tokens: int
) -> None:
    # gpt_oss stores its weights transposed ([k, n]: token @ weight), the others [n, k] (weight @ token).
    path, cfg = _config(tmp_path, model_type)
    size: dict[str, Any] = {"seq_len": tokens} if phase == "prefill" else {"batch": tokens, "kv_len": 8}
    g = capture(path, phase=phase, device="meta", **size)
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    top_k, hidden = cfg["num_experts_per_tok"], cfg["hidden_size"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    pairs = tokens * top_k
    want = {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}  # (n, k): out and in features
    gemms = _expert_gemms(g)
    assert len(gemms) == 2 * cfg["num_hidden_layers"]
    producers = {t.id: o for o in g.ops for t in o.outputs}
    for op in gemms:
        part = op.target.removeprefix("moe_experts_")
        n, k = want[part]
        assert (op.batch, op.m, op.n, op.k, op.groups) == (pairs, 1, n, k, 1), op.definition
        assert op.flops == 2 * pairs * n * k
        assert op.definition == f"moe_batched_mm_e{experts}_h{hidden}_i{inter}_topk{top_k}_{part}"
        # Each pair reads its own gathered weight copy and its token, and writes its output row.
        assert op.bytes_read == pairs * (n * k + k) * BF16
        assert op.bytes_written == pairs * n * BF16
        # The copy comes from the gather of the stacked weights by the routed ids: a memory op.
        weight = next(t for t in op.inputs if t.numel == pairs * n * k)
        gather = producers[weight.id]
        assert isinstance(gather, Memory) and gather.fn == "index"
        assert gather.inputs[0].shape[0] == experts and gather.outputs[0].shape[0] == pairs


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_the_products_are_the_bmm_calls_transformers_runs_on_a_cpu(tmp_path: Path, model_type: str) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    path, _ = _config(tmp_path, model_type)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path)).eval()
    ids = torch.arange(10).reshape(1, 10)
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    inside: list[bool] = [False]  # within an experts module's forward (5.17's RoPE runs a bmm too)
    for m in model.modules():
        if is_experts_module(m):
            m.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
            m.register_forward_hook(lambda *_: inside.__setitem__(0, False))

    class Bmm(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.bmm.default and inside[0]:
                calls.append((tuple(args[0].shape), tuple(args[1].shape)))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Bmm():
        model(ids)
    g = capture(model, device="cpu", seq_len=10, dtype="fp32")
    gemms = _expert_gemms(g)
    assert len(gemms) == len(calls) > 0
    for op, (a, b) in zip(gemms, calls, strict=True):
        (batch, p, q), r = a, b[-1]  # [batch, p, q] @ [batch, q, r]
        assert op.batch == batch and op.k == q and op.m * op.n == p * r and op.m == 1
        assert op.flops == 2 * batch * p * q * r
        assert op.bytes_read == batch * (p * q + q * r) * 4
        assert op.bytes_written == batch * p * r * 4


def test_rebatch_finds_the_products_by_their_pair_sized_tensors(tmp_path: Path) -> None:
    from opgraph.transforms.rebatch_moe import moe_layout

    path, _ = _config(tmp_path, "qwen3_moe")
    g = capture(path, device="meta", seq_len=12)
    layout = moe_layout(g)
    products = {o.id for o in _expert_gemms(g)}
    assert products and {layout.role[i] for i, o in enumerate(g.ops) if o.id in products} == {"batched"}


def test_a_rebatched_batched_mm_template_equals_a_fresh_capture(tmp_path: Path) -> None:
    from opgraph.transforms import TEMPLATE_PREFILL, rebatch

    path, _ = _config(tmp_path, "qwen3_moe")
    template = capture(path, device="meta", batch=TEMPLATE_PREFILL["batch"], seq_len=TEMPLATE_PREFILL["seq_len"])
    got = rebatch(template, batch=3, q_len=9)
    fresh = capture(path, device="meta", batch=3, seq_len=9)
    skip = {"id", "target", "scope", "call", "inputs", "outputs", "host_gap_us", "stage", "step"}
    assert [{k: v for k, v in o.__dict__.items() if k not in skip} for o in _expert_gemms(got)] == [
        {k: v for k, v in o.__dict__.items() if k not in skip} for o in _expert_gemms(fresh)
    ]
