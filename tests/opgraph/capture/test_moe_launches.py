"""MoE as the model runs it: what the experts modules launch on meta equals what transformers' own
forward launches on real tensors under the same routing, a real device keeps the model's own router
(unmodified outputs) and the graph carries the tokens per expert it observed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from opgraph.capture import capture  # noqa: E402
from opgraph.capture.api import record  # noqa: E402
from opgraph.capture.moe_model import OBSERVED_ASSUMPTION, is_experts_module  # noqa: E402
from opgraph.capture.phase import CaptureOptions  # noqa: E402
from opgraph.ir import is_nested  # noqa: E402
from opgraph.ir.ops import MoeRouting, OpKind  # noqa: E402
from tests.opgraph.capture.test_capture_architectures import tiny_config  # noqa: E402

MOE = ["mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3"]


def _expert_events(path: str, **options: Any) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
    """The aten calls inside every experts module call, in order, with their input shapes."""
    rec = record(path, CaptureOptions(**options)).recorder
    calls = {i for i, c in enumerate(rec.calls) if c.module is not None and is_experts_module(c.module)}
    inside = set(calls)
    for i, c in enumerate(rec.calls):  # submodules of an experts module (its activation)
        if c.parent in inside:
            inside.add(i)
    return [(e.fn, tuple(t.shape for t in e.inputs)) for e in rec.events if e.call in inside]


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_meta_launches_what_the_model_runs_under_the_same_routing(tmp_path: Path, model_type: str, phase: str) -> None:
    path = tiny_config(tmp_path, model_type)
    size = {"seq_len": 12} if phase == "prefill" else {"kv_len": 12, "batch": 3}
    meta = _expert_events(path, phase=phase, device="meta", **size)
    # On cpu the model's own experts forward runs on real tensors; moe_skew=0 only sets its router's
    # indices to the balanced loads, so both runs route the same tokens per expert.
    cpu = _expert_events(path, phase=phase, device="cpu", moe_skew=0.0, **size)
    assert meta == cpu
    assert any(fn in ("_grouped_mm", "grouped_mm") for fn, _ in meta)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_launch_counts_do_not_depend_on_the_routing(tmp_path: Path, model_type: str) -> None:
    # transformers' grouped_mm experts launch a fixed sequence; only the rows per group vary.
    path = tiny_config(tmp_path, model_type)
    meta = Counter(fn for fn, _ in _expert_events(path, device="meta", seq_len=12))
    own = Counter(fn for fn, _ in _expert_events(path, device="cpu", seq_len=12))
    assert meta == own


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_routing_steps_are_masked_exactly_when_transformers_masks_sentinel_rows(
    tmp_path: Path, model_type: str
) -> None:
    # transformers 5.17's grouped_mm experts mask expert-parallel sentinel rows on every call (a
    # masked_fill_ before the first expert GEMM, a masked_fill after each); 5.18 on, under EP only.
    from packaging.version import Version

    masks = Version(transformers.__version__) < Version("5.18")
    graph = capture(tiny_config(tmp_path, model_type), device="meta", seq_len=12)
    routing = [op for op in graph.ops_of(OpKind.MOE_ROUTING) if isinstance(op, MoeRouting)]
    steps = [op for op in routing if op.fn in ("dispatch", "combine")]
    assert {op.fn for op in steps} == {"dispatch", "combine"}
    assert {op.masked for op in steps} == {masks}
    assert not any(op.masked for op in routing if op.fn == "route")


def _tiny_model(tmp_path: Path, model_type: str) -> Any:
    config = transformers.AutoConfig.from_pretrained(tiny_config(tmp_path, model_type))
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _captured_with_routing(model: Any, tokens: int, dtype: str) -> tuple[Any, list[Any], Any, Any]:
    """(graph captured on the CPU, routing indices of each experts call, logits before, logits after)."""
    routed: list[Any] = []
    for m in model.modules():
        if is_experts_module(m):
            m.register_forward_pre_hook(lambda _m, args: routed.append(args[1].clone()))
    ids = torch.arange(tokens).reshape(1, tokens)
    with torch.no_grad():
        before = model(ids).logits
    routed.clear()
    g = capture(model, device="cpu", seq_len=tokens, dtype=dtype)
    seen = list(routed)
    with torch.no_grad():
        after = model(ids).logits
    return g, seen, before, after


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_real_device_runs_the_unmodified_model_and_records_its_routing(tmp_path: Path, model_type: str) -> None:
    g, seen, before, after = _captured_with_routing(_tiny_model(tmp_path, model_type).to(torch.bfloat16), 10, "bf16")
    # The capture left the model as it was: its own router and experts (no balanced stand-in).
    assert torch.equal(before, after)
    assert OBSERVED_ASSUMPTION in g.metadata.assumptions
    # The recorded call's routing is the graph's: one grouped GEMM per projection whose groups are
    # the experts the router picked, and FLOPs of the rows they got.
    gate_up = [o for o in g.ops_of(OpKind.GEMM) if o.target == "moe_experts_gate_up"]
    assert len(gate_up) == len(seen) > 0
    for op, idx in zip(gate_up, seen, strict=True):
        loads = [c for c in torch.bincount(idx.reshape(-1)).tolist() if c]
        assert op.groups == len(loads)  # type: ignore[attr-defined]
        assert op.flops == 2 * sum(loads) * op.n * op.k  # type: ignore[attr-defined]


def test_meta_without_a_grouped_kernel_emits_one_product_per_expert(tmp_path: Path) -> None:
    # fp16 has no grouped kernel: torch runs one mm per expert that received rows, at its own rows.
    path = tiny_config(tmp_path, "qwen3_moe")
    events = _expert_events(path, device="meta", seq_len=12, dtype="fp16", moe_skew=1.0)
    assert not any(fn in ("_grouped_mm", "grouped_mm") for fn, _ in events)
    g = capture(path, device="meta", seq_len=12, dtype="fp16", moe_skew=1.0)
    experts = [o for o in g.ops_of(OpKind.GEMM) if o.target == "moe_experts_gate_up" and o.layer == 0]
    rows = [o.m for o in experts]  # type: ignore[attr-defined]
    assert sum(rows) == 12 * 2  # every token-expert pair once
    assert len(set(rows)) > 1  # skewed: the busiest expert has the most rows
    mm_rows = [shapes[0][0] for fn, shapes in events if fn == "mm"]
    assert sorted(rows) == sorted(mm_rows[: len(rows)])


def test_a_real_device_without_a_grouped_kernel_records_the_fallbacks_products_at_the_observed_rows(
    tmp_path: Path,
) -> None:
    # An fp16 _grouped_mm runs torch's per-expert fallback on a GPU (and on the CPU, which runs it for every
    # dtype): a capture with the model's own routing must hold those products (at each expert's observed
    # rows), not one grouped kernel a GPU never launches, and the model's outputs must not change.
    model = _tiny_model(tmp_path, "qwen3_moe").to(torch.float16)
    model.config._experts_implementation = "grouped_mm"
    g, routed, before, after = _captured_with_routing(model, 12, "fp16")
    assert torch.equal(before, after)
    seen = routed[0]
    products = [o for o in g.ops_of(OpKind.GEMM) if o.target == "moe_experts_gate_up" and o.layer == 0]
    loads = [c for c in torch.bincount(seen.reshape(-1)).tolist() if c]
    assert sorted(o.m for o in products) == sorted(loads)  # type: ignore[attr-defined]
    assert all(o.groups == 1 for o in products)  # type: ignore[attr-defined]
    assert products[0].definition.endswith("@sync") and all(o.definition.endswith("@nested") for o in products[1:])
    # bf16 has a grouped kernel: one grouped GEMM, as before.
    bf16 = capture(_tiny_model(tmp_path, "qwen3_moe").to(torch.bfloat16), device="cpu", seq_len=12, dtype="bf16")
    grouped = [o for o in bf16.ops_of(OpKind.GEMM) if o.target == "moe_experts_gate_up" and o.layer == 0]
    assert len(grouped) == 1 and grouped[0].groups > 1  # type: ignore[attr-defined]


def _loads_by_call(graph: Any) -> list[list[int]]:
    """Rows per expert product of each fp16 fallback call (gate_up), in graph order, sorted."""
    calls: list[list[int]] = []
    for o in graph.ops_of(OpKind.GEMM):
        if o.target == "moe_experts_gate_up":
            if not is_nested(o):  # a call's first product (its host sync), then the nested ones
                calls.append([])
            calls[-1].append(o.m)
    return [sorted(rows) for rows in calls]


def _own_loads(model: Any) -> list[list[int]]:
    """Rows per expert (sorted) of each experts call when ``model`` runs the tokens a capture of batch 2 and
    12 tokens on a real device feeds it (seeded random ids)."""
    routed: list[Any] = []
    for m in model.modules():
        if is_experts_module(m):
            m.register_forward_pre_hook(lambda _m, args: routed.append(args[1].clone()))
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
    return [sorted(c for c in torch.bincount(r.reshape(-1)).tolist() if c) for r in routed]


def test_a_seeded_cpu_capture_holds_the_routing_of_the_model_built_with_that_seed(tmp_path: Path) -> None:
    # Without a GPU, the routing of a model with given weights comes from a CPU run of them: capture
    # --device cpu --seed S builds the weights torch.manual_seed(S) then from_config give (what
    # benchmarks/gpu/heldout.py --weights-on cpu moves to the GPU) and records the products their
    # router's loads make, one mm per expert that got rows (fp16: torch's fallback).
    path = tiny_config(tmp_path, "qwen3_moe")
    config = transformers.AutoConfig.from_pretrained(path)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()
    expected = _own_loads(model)
    g = capture(path, device="cpu", batch=2, seq_len=12, dtype="fp16", seed=7)
    assert _loads_by_call(g) == expected
    assert g.metadata.capture.seed == 7 and OBSERVED_ASSUMPTION in g.metadata.assumptions
    assert _loads_by_call(capture(path, device="cpu", batch=2, seq_len=12, dtype="fp16", seed=7)) == expected
    assert _loads_by_call(capture(path, device="cpu", batch=2, seq_len=12, dtype="fp16", seed=8)) != expected
    assert capture(path, device="meta", seq_len=4).metadata.capture.seed is None  # no weights on meta


def test_weights_loads_the_checkpoint_and_records_its_routing(tmp_path: Path) -> None:
    # A model folder with its weight files: capture --device cpu --weights loads them (not seeded random
    # ones) and records the routing they give; --layers keeps the first layers' weights.
    from typer.testing import CliRunner

    from opgraph.cli.app import app
    from opgraph.ir import load_graph

    config = transformers.AutoConfig.from_pretrained(tiny_config(tmp_path, "qwen3_moe"))
    torch.manual_seed(123)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()
    folder = tmp_path / "trained"
    model.save_pretrained(folder)
    expected = _own_loads(model)
    out = tmp_path / "g.json"
    args = ["capture", str(folder), "--device", "cpu", "--weights", "--dtype", "fp16", "--batch", "2", "--seq-len"]
    res = CliRunner().invoke(app, [*args, "12", "-o", str(out)])
    assert res.exit_code == 0, res.output
    g = load_graph(out)
    assert _loads_by_call(g) == expected
    assert g.metadata.capture.weights == "checkpoint" and g.metadata.capture.seed is None
    assert _loads_by_call(capture(str(folder), device="cpu", batch=2, seq_len=12, dtype="fp16")) != expected
    one = capture(str(folder), device="cpu", batch=2, seq_len=12, dtype="fp16", weights=True, layers=1)
    assert _loads_by_call(one) == expected[:1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights"], "--weights: only applies to a model built on cpu or cuda"),
        (["--device", "cpu", "--weights", "--seed", "2"], "--seed: only applies to random weights"),
        (["--device", "cpu", "--weights"], "has no weights to load"),
    ],
)
def test_weights_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from opgraph.cli.app import app

    out = tmp_path / "g.json"
    res = CliRunner().invoke(
        app, ["capture", tiny_config(tmp_path, "qwen3_moe"), "--seq-len", "8", *args, "-o", str(out)]
    )
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and not out.exists()


def _eight_experts(tmp_path: Path, layers: int) -> str:
    path = Path(tiny_config(tmp_path, "mixtral"))
    cfg = json.loads(path.read_text())
    cfg.update(num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=layers)
    path.write_text(json.dumps(cfg))
    return str(path)


def test_balanced_routing_reaches_the_expected_experts_over_the_layers_not_rounded_in_each(tmp_path: Path) -> None:
    # 4 decode tokens picking 2 of 8 experts reach 8 (1 - (6/8)^4) = 5.47 in expectation: rounded in each
    # layer that is 5 everywhere (9% fewer expert weights read than expected); realised over the layers it
    # is 5, 6, 5, 6, so every prefix of the layers is within half an expert of the expectation. Rebatching
    # a template to that shape gives the same experts per layer as the fresh capture.
    from opgraph.transforms import rebatch

    path = _eight_experts(tmp_path, 4)
    fresh = capture(path, phase="decode", batch=4, kv_len=8, dtype="fp16")
    per_layer = [n // 2 for n in _products_per_layer(fresh)]  # gate_up and down per expert
    assert per_layer == [5, 6, 5, 6]
    expected = 8 * (1 - (6 / 8) ** 4)
    assert all(abs(sum(per_layer[: i + 1]) - (i + 1) * expected) <= 0.5 for i in range(4))
    template = capture(path, phase="decode", batch=13, kv_len=41, dtype="fp16")
    assert _products_per_layer(rebatch(template, batch=4, kv_len=9)) == _products_per_layer(fresh)


def _products_per_layer(graph: Any) -> list[int]:
    layers: Counter[int] = Counter(o.layer for o in graph.ops_of(OpKind.GEMM) if o.target.startswith("moe_experts"))
    return [layers[k] for k in sorted(layers)]


def test_an_idle_experts_product_keeps_the_dependencies_through_it(tmp_path: Path) -> None:
    # torch's fallback calls mm for an idle expert too (zero rows, no kernel: folded away), writing into the
    # call's output after the products before it; what reads that output must still depend on them.
    import networkx as nx

    g = capture(_eight_experts(tmp_path, 2), phase="decode", batch=1, kv_len=8, dtype="fp16")
    dag = g.to_networkx()
    combines = [o.id for o in g.ops if getattr(o, "fn", "") == "combine"]
    products = [o for o in g.ops_of(OpKind.GEMM) if o.target.startswith("moe_experts")]
    assert len(products) == 2 * 2 * 2  # one token: 2 of 8 experts, the last 6 idle, in 2 layers
    for op in products:
        combine = next(c for c in combines if c > op.id)
        assert nx.has_path(dag, op.id, combine), op


def test_explicit_balanced_routing_is_stated_on_a_real_device(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "mixtral"), device="cpu", seq_len=8, moe_skew=0.0)
    assert any("balanced" in a for a in g.metadata.assumptions)
    assert OBSERVED_ASSUMPTION not in g.metadata.assumptions


def _experts_of(g: Any, part: str) -> list[Any]:
    return [o for o in g.ops_of(OpKind.GEMM) if o.target == f"moe_experts_{part}" and o.layer == 0]


def test_a_grouped_gemm_moves_the_weights_of_the_experts_that_got_rows_only(tmp_path: Path) -> None:
    # A decode of one token routes top_k pairs: the grouped kernel reads the weights of top_k experts,
    # not of every expert the stacked weight tensor holds (a 128-expert decode would read 2x-16x less).
    path = tiny_config(tmp_path, "qwen3_moe")
    g = capture(path, phase="decode", batch=1, kv_len=8, device="meta")
    (op,) = _experts_of(g, "gate_up")
    weight = next(t for t in op.inputs if len(t.shape) == 3)
    experts = weight.shape[0]
    assert op.groups < experts  # type: ignore[attr-defined]
    per_expert = weight.nbytes // experts
    rows_in = op.m * op.groups * op.k * 2  # type: ignore[attr-defined]
    offsets = sum(t.nbytes for t in op.inputs if len(t.shape) == 1)
    assert op.bytes_read == rows_in + op.groups * per_expert + offsets  # type: ignore[attr-defined]
    assert op.bytes_read < weight.nbytes


def test_meta_runs_torch_fallback_as_torch_does(tmp_path: Path) -> None:
    # fp16 has no grouped kernel: ATen's fallback allocates the output, copies the offsets to the host
    # and calls mm once per expert, idle ones included (zero rows, no kernel: no op).
    path = tiny_config(tmp_path, "qwen3_moe")
    events = _expert_events(path, phase="decode", batch=1, kv_len=8, device="meta", dtype="fp16")
    fns = [fn for fn, _ in events]
    g = capture(path, phase="decode", batch=1, kv_len=8, device="meta", dtype="fp16")
    experts = next(o.experts for o in g.ops_of(OpKind.MOE_ROUTING))  # type: ignore[attr-defined]
    calls = fns.count("empty_strided")  # one output per grouped call
    assert calls > 0 and fns.count("_to_copy") >= calls
    assert fns.count("mm") == calls * experts
    zero_rows = [shapes for fn, shapes in events if fn == "mm" and shapes[0][0] == 0]
    assert zero_rows  # one token, top_k < experts: idle experts are still called
    gate_up = _experts_of(g, "gate_up")
    assert 0 < len(gate_up) < experts
    assert all(o.m > 0 for o in gate_up)  # type: ignore[attr-defined]


def test_the_fallbacks_output_slices_are_written_not_read(tmp_path: Path) -> None:
    # Each product of torch's fallback writes into a slice of the call's output (mm(a, b, out=slice)):
    # the slice is an input of the call but the kernel never reads it, so the product's bytes are its
    # rows and its expert's weights read, its rows written (counting the slice read too made the
    # roofline of a Qwen3-30B-A3B down product 13% longer than the loop points it is priced from).
    g = capture(tiny_config(tmp_path, "qwen3_moe"), device="meta", seq_len=12, dtype="fp16", moe_skew=1.0)
    products = [o for o in g.ops_of(OpKind.GEMM) if o.target.startswith("moe_experts_")]
    assert products
    for op in products:
        m, n, k = op.m, op.n, op.k  # type: ignore[attr-defined]
        out = next(t for t in op.inputs if t.shape == (m, n))  # the out= slice, recorded as an input
        assert op.bytes_read == sum(t.nbytes for t in op.inputs) - out.nbytes
        assert op.bytes_written == m * n * 2
        if is_nested(op):  # a call's first product also reads the offsets it copies to the host
            assert op.bytes_read == (m * k + k * n) * 2
    assert any(is_nested(o) for o in products)


def test_an_out_argument_is_recorded_as_written_and_an_in_place_one_as_read() -> None:
    from opgraph.capture.recorder import Recorder

    rec = Recorder()
    a, b, c = torch.ones(4, 8), torch.ones(8, 2), torch.empty(4, 2)
    with rec.recording():
        torch.mm(a, b, out=c)
        c.add_(1.0)
    mm, add = (e for e in rec.events if e.fn in ("mm", "add_"))
    assert [r.shape for r in mm.inputs] == [(4, 8), (8, 2), (4, 2)]
    assert mm.written == (mm.inputs[2].tid,) and mm.mutates
    assert add.written == () and add.mutates  # add_ reads what it writes
