"""MoE experts that run as one unbatched GEMM per expert (an eager experts loop, a grouped-GEMM fallback)
are typed ``moe``: from the experts module's scope, or from the loop's shapes; dense GEMMs stay ``gemm``."""

from __future__ import annotations

import gzip
import json
import tarfile
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import load_timeline
from opgraph.trace import AnalysisResult, KernelType, analyze, load_trace, load_trace_data
from opgraph.trace import classify as classify_mod
from opgraph.trace.analysis import Analyzer
from tests.conftest import REPO, TRACES
from tests.opgraph.trace.test_classify import _GATHER, _MUL, _RMS, _SILU, _SORT, _TOPK, GEMM, PS, _Builder, _ev

HIDDEN, INTER, EXPERTS = 1024, 256, 8
"""Hidden size, an expert's intermediate size and the expert count of the synthetic MoE layers."""
SHARED_INTER = 4 * INTER
"""A shared expert's intermediate size (Qwen2-MoE's is several routed experts' wide)."""
LINEAR = ("aten::linear", "aten::matmul", "aten::mm")
SPLIT_K_REDUCE = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(float*)"
_NONZERO = "void at_cuda_detail::cub::detail::select::DeviceSelectSweepKernel<int>(int*)"
_INDEX_ADD = "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(int)"
_ADD = "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>(int)"
_SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"


def _call(b: _Builder, ops: tuple[str, ...], names: Sequence[str], dims: list[Any] | None = None) -> None:
    """One call of ``ops`` (outermost first; the innermost takes ``dims``) that launches ``names`` in turn, as
    a split-K GEMM launches its GEMM and its reduce kernel; kernels carry the op's External id, as Kineto's do."""
    ext = b.corr
    b.corr += 1
    t = b.t
    for depth, op in enumerate(ops):
        args: dict[str, Any] = {"External id": ext}
        if dims is not None and depth == len(ops) - 1:
            args["Input Dims"] = dims
        b.events.append(_ev("cpu_op", op, t + depth * 0.1, 4.0 * len(names) + 2 - depth * 0.2, **args))
    for j, name in enumerate(names):
        c = b.corr
        b.corr += 1
        b.events.append(
            _ev("cuda_runtime", "cudaLaunchKernel", t + 1 + 4 * j, 1, correlation=c, **{"External id": ext})
        )
        b.events.append(
            _ev("kernel", name, t + 3 + 4 * j, 3.0, correlation=c, device=0, stream=7, **{"External id": ext})
        )
    b.t += 4.0 * len(names) + 8


def _scope(b: _Builder, name: str, body: Callable[[], None]) -> None:
    """A ``record_function`` range named ``name`` around what ``body`` launches (a module's scope)."""
    start = b.t
    body()
    b.events.append(_ev("user_annotation", name, start - 0.5, b.t - start))


def _moe_layer(
    b: _Builder,
    layer: int,
    tokens_per_expert: Sequence[int],
    *,
    shapes: bool = True,
    scopes: bool = False,
    shared: bool = False,
) -> None:
    """A transformers MoE decoder layer whose experts run eagerly: the router's GEMM and top-k, then per
    expert that received tokens its token gather, fused gate-up GEMM, SwiGLU, split-K down GEMM (two
    kernels, one call) and weighted scatter-add; with ``shared`` a shared expert's MLP after them."""
    tokens = sum(tokens_per_expert)

    def dims(m: int, k: int, n: int) -> list[Any] | None:
        return [[m, k], [k, n]] if shapes else None

    _call(b, (_RMS[1],), [_RMS[0]])
    for n in (HIDDEN, HIDDEN // 4, HIDDEN // 4):  # q, k and v projections: k and v of one shape
        _call(b, LINEAR, [GEMM], dims(tokens, HIDDEN, n))
    _call(b, ("aten::scaled_dot_product_attention", "aten::_cudnn_attention_forward"), [_SDPA])
    _call(b, LINEAR, [GEMM], dims(tokens, HIDDEN, HIDDEN))
    _call(b, (_RMS[1],), [_RMS[0]])
    _call(b, LINEAR, [GEMM], dims(tokens, HIDDEN, EXPERTS))  # router logits
    _call(b, ("aten::softmax", "aten::_softmax"), ["void (anonymous namespace)::softmax_warp_forward<float>(float*)"])
    _call(b, ("aten::topk",), [_TOPK, _SORT])
    _call(b, ("aten::nonzero",), [_NONZERO])

    def experts() -> None:
        for m in tokens_per_expert:
            _call(b, ("aten::where", "aten::nonzero"), [_NONZERO])
            _call(b, ("aten::index",), [_GATHER])
            _call(b, LINEAR, [GEMM], dims(m, HIDDEN, 2 * INTER))
            _call(b, ("aten::silu",), [_SILU])
            _call(b, ("aten::mul",), [_MUL])
            _call(b, LINEAR, [GEMM, SPLIT_K_REDUCE], dims(m, INTER, HIDDEN))
            _call(b, ("aten::mul",), [_MUL])
            _call(b, ("aten::index_add_",), [_INDEX_ADD])

    if scopes:
        _scope(b, f"model.layers.{layer}.mlp.experts", experts)
    else:
        experts()
    if shared:
        _call(b, LINEAR, [GEMM], dims(tokens, HIDDEN, SHARED_INTER))  # gate projection
        _call(b, LINEAR, [GEMM], dims(tokens, HIDDEN, SHARED_INTER))  # up projection, the same shape
        _call(b, ("aten::silu",), [_SILU])
        _call(b, ("aten::mul",), [_MUL])
        _call(b, LINEAR, [GEMM], dims(tokens, SHARED_INTER, HIDDEN))
    _call(b, ("aten::add",), [_ADD])


def _types(path: Path) -> list[KernelType]:
    """The final type of every kernel of the trace at ``path``, as the analysis gives them."""
    (data,) = load_trace_data(path)
    Analyzer(PS).labels(data)
    return [g.ktype for g in data.gpu if g.kind == "kernel"]


def _moe(r: AnalysisResult) -> int:
    return next((b.count for b in r.by_type if b.name == "moe"), 0)


# ---- the loop's shapes: no scope, input shapes recorded


@pytest.mark.parametrize("shared", [False, True])
def test_a_per_expert_gemm_loop_is_moe_from_its_shapes(tmp_path: Path, shared: bool) -> None:
    b = _Builder()
    hits = [[5, 3, 7], [2, 2, 1, 9, 2]]  # tokens per expert that received any, per layer
    for layer, tokens in enumerate(hits):
        _moe_layer(b, layer, tokens, shared=shared)
    r = analyze(b.write(tmp_path))
    # per expert: 1 gate-up kernel + 2 down kernels (split-K); the router's top-k and sort, 2 per layer
    experts = sum(len(t) for t in hits)
    assert _moe(r) == 3 * experts + 2 * len(hits)
    # dense GEMMs: 4 attention projections, the router, and the shared expert's 3 (its gate and up
    # projections share a shape, but its down projection runs once)
    dense = 5 + (3 if shared else 0)
    assert next(b.count for b in r.by_type if b.name == "gemm") == dense * len(hits)
    assert r.layers_per_pass == (2,) and {x.kind for x in r.layers} == {"MHA_MOE"}
    assert [x.moe_us for x in r.layers] == [3.0 * (3 * len(t) + 2) for t in hits]
    (note,) = [n for n in r.notes if "typed moe" in n]
    assert note.startswith(f"{3 * experts} GEMM kernels ({2 * experts} calls) in 2 MoE blocks typed moe, not gemm")
    # the imported timeline keeps the GEMMs' shapes: analysed again, it says the same
    tl = load_trace(tmp_path / "t.json")
    assert sum(1 for s in tl.spans if s.category == "moe") == _moe(r)
    assert [n for n in tl.notes if "typed moe" in n] == [note]
    again = analyze(tl)
    assert again.by_type == r.by_type
    assert [n for n in again.notes if "typed moe" in n] == [note]  # said once, not once more per reading


def test_one_expert_or_a_dense_mlp_after_a_router_stays_gemm(tmp_path: Path) -> None:
    # one expert that received tokens runs one up and one down GEMM: a dense MLP's pattern, so no loop;
    # a shared expert's MLP after it neither
    b = _Builder()
    _moe_layer(b, 0, [6], shared=True)
    _moe_layer(b, 1, [6])
    r = analyze(b.write(tmp_path))
    assert _moe(r) == 2 * 2  # the routers' top-k and sort only
    assert not [n for n in r.notes if "typed moe" in n]


def test_without_shapes_or_scopes_the_loop_is_not_guessed(tmp_path: Path) -> None:
    b = _Builder()
    _moe_layer(b, 0, [5, 3, 7], shapes=False)
    assert _types(b.write(tmp_path)).count(KernelType.MOE) == 2


# ---- the experts module's scope


def test_gemms_inside_an_experts_scope_are_moe_without_shapes(tmp_path: Path) -> None:
    b = _Builder()
    hits = [[5], [2, 2, 1]]  # one expert is no loop by its shapes; its scope says what it is
    for layer, tokens in enumerate(hits):
        _moe_layer(b, layer, tokens, shapes=False, scopes=True, shared=True)
    r = analyze(b.write(tmp_path))
    experts = sum(len(t) for t in hits)
    assert _moe(r) == 3 * experts + 2 * len(hits)
    assert next(b.count for b in r.by_type if b.name == "gemm") == 8 * len(hits)  # router, shared expert stay
    (note,) = [n for n in r.notes if "typed moe" in n]
    assert note.startswith(f"{3 * experts} GEMM kernels launched inside MoE experts scopes")
    assert "'model.layers.0.mlp.experts', 'model.layers.1.mlp.experts'" in note


def test_the_transformers_grouped_mm_fallback_op_is_moe(tmp_path: Path) -> None:
    # transformers' own fallback of grouped_mm (a custom op) runs one torch.mm per expert
    b = _Builder()
    for _ in range(3):
        b.kernel(GEMM, ("transformers::grouped_mm_fallback", "aten::mm"))
    assert _types(b.write(tmp_path)) == [KernelType.MOE] * 3


# ---- a real fp16 Qwen3-MoE prefill: torch's C++ fallback of _grouped_mm runs one mm per expert

HELDOUT = REPO / "benchmarks" / "results" / "gpu" / "h100" / "heldout" / "heldout.tar.gz"
CASE = "heldout/qwen3moe_prefill_b2_s1024_fp16_l2"


@cache
def _heldout_case() -> tuple[dict[str, Any], dict[str, Any]]:
    """(trace, model config) of the fp16 Qwen3-MoE prefill, read from the committed tarball."""
    if not HELDOUT.exists():
        pytest.skip(f"the held-out GPU results are not in {HELDOUT.parent}")
    with tarfile.open(HELDOUT) as tar:

        def member(name: str) -> bytes:
            f = tar.extractfile(name)
            assert f is not None
            return f.read()

        trace = json.loads(gzip.decompress(member(f"{CASE}.trace.json.gz")))
        config = json.loads(member(f"{CASE}.config.json"))
    return trace, config


def _grouped_mm_kernels(trace: dict[str, Any], tmp_path: Path) -> set[tuple[float, str]]:
    """The kernels that aten::mm launched inside aten::_grouped_mm, by (start, name): the trace's own word
    on which kernels ran experts."""
    path = tmp_path / "original.json"
    path.write_text(json.dumps(trace))
    (data,) = load_trace_data(path)
    return {
        (g.ts + data.origin_us, g.name)
        for g in data.gpu
        if g.kind == "kernel" and g.launch_stack[:2] == ("aten::mm", "aten::_grouped_mm")
    }


def _moe_kernels(path: Path) -> set[tuple[float, str]]:
    """The kernels that ``aten::mm`` launched and the imported timeline types ``moe``, by (start, name)."""
    tl = load_trace(path)
    origin = tl.source.config["origin_us"]
    assert isinstance(origin, float)
    return {
        (s.start_us + origin, s.name) for s in tl.spans if s.category == "moe" and s.args.get("launch_op") == "aten::mm"
    }


def _without_grouped_mm(trace: dict[str, Any], *, drop_scopes: bool = False) -> dict[str, Any]:
    """The trace as a loop outside any grouped-GEMM op would leave it: ``aten::_grouped_mm`` (the op the
    launch rules read) taken out, and with ``drop_scopes`` the experts modules' ranges too."""

    def keep(e: dict[str, Any]) -> bool:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::_grouped_mm":
            return False
        return not (drop_scopes and e.get("cat") == "user_annotation" and str(e.get("name")).endswith(".experts"))

    return {**trace, "traceEvents": [e for e in trace["traceEvents"] if keep(e)]}


def test_real_fp16_expert_gemms_are_moe_from_their_scope(tmp_path: Path) -> None:
    trace, _ = _heldout_case()
    truth = _grouped_mm_kernels(trace, tmp_path)
    assert len(truth) == 462  # 128 experts' up and down GEMMs in each of 2 layers, some split-K
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_without_grouped_mm(trace)))
    assert _moe_kernels(path) == truth
    r = analyze(path)
    assert r.by_type == analyze(tmp_path / "original.json").by_type
    (note,) = [n for n in r.notes if "typed moe" in n]
    assert note.startswith("462 GEMM kernels launched inside MoE experts scopes")


def _with_shapes(trace: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The trace with the input shapes ``record_shapes`` would have given every ``aten::mm`` (it was recorded
    without), from the model's config: by the module range around a dense one, by its ``_grouped_mm`` call
    (gate-up, then down, in each layer) for an expert's. Expert token counts are unknown: 16 rows each."""
    h, i = config["hidden_size"], config["moe_intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    dense = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate": (h, config["num_experts"]),
    }
    dense["lm_head"] = (h, config["vocab_size"])
    events = trace["traceEvents"]
    grouped = sorted((e for e in events if e.get("name") == "aten::_grouped_mm"), key=lambda e: e["ts"])
    modules = [e for e in events if e.get("cat") == "user_annotation" and e["name"].split(".")[-1] in dense]
    modules += [e for e in events if e.get("name") == "heldout_mod:lm_head"]

    def inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
        return bool(outer["ts"] <= e["ts"] <= outer["ts"] + outer["dur"])

    out = []
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm":
            call = next((n for n, g in enumerate(grouped) if inside(e, g)), None)
            if call is not None:
                k, n = (h, 2 * i) if call % 2 == 0 else (i, h)
                m = 16
            else:
                module = next((m for m in modules if inside(e, m)), None)
                assert module is not None, e
                k, n = dense[module["name"].split(".")[-1].split(":")[-1]]
                m = 2 * 1024
            e = {**e, "args": {**e["args"], "Input Dims": [[m, k], [k, n]]}}
        out.append(e)
    return {**trace, "traceEvents": out}


def test_real_fp16_expert_gemms_are_moe_from_their_shapes(tmp_path: Path) -> None:
    trace, config = _heldout_case()
    truth = _grouped_mm_kernels(trace, tmp_path)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_without_grouped_mm(_with_shapes(trace, config), drop_scopes=True)))
    assert _moe_kernels(path) == truth
    r = analyze(path)
    # the dense GEMMs (attention projections, router, LM head: k and v projections of one shape) stay gemm
    assert r.by_type == analyze(tmp_path / "original.json").by_type
    # one kernel per call: of the 512 mm calls (128 experts x 2 projections x 2 layers), those of experts
    # that received no token launched none
    (note,) = [n for n in r.notes if "typed moe" in n]
    assert note.startswith("462 GEMM kernels (462 calls) in 2 MoE blocks typed moe")


# ---- dense models: nothing changes


DENSE = {
    "llama1b_generate_p64_d5": REPO / "tests" / "data" / "traces" / "heldout" / "llama1b_generate_p64_d5.json.gz",
    "hf-llama-1b-like": TRACES / "hf-llama-1b-like-h200-prefill512-decode8.json.gz",
}
"""Dense Llama traces with input shapes: a committed one and a shared one."""


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_llama_kernel_types_do_not_change(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = DENSE[name]
    if not path.exists():
        pytest.skip(f"trace {path.name} not found in {path.parent} (shared data lives beside the repo)")
    # the same trace typed with and without the expert-scope and expert-loop rules: every kernel keeps
    # its type (Llama's gate and up projections, and its k and v ones, share a shape; no router runs)
    with_rules = _types(path)
    monkeypatch.setattr(classify_mod, "expert_scopes", lambda *_: [])
    monkeypatch.setattr(classify_mod, "expert_loops", lambda _: (0, 0, 0))
    assert _types(path) == with_rules
    assert KernelType.MOE not in with_rules and with_rules.count(KernelType.GEMM) > 100
    assert not [n for n in analyze(path).notes if "typed moe" in n]


def test_cli_import_notes_the_retyped_gemms_as_written(tmp_path: Path) -> None:
    # the note quotes the scope's name, brackets and all (the console must not read them as markup)
    b = _Builder()
    for layer in range(2):
        _call(b, (_RMS[1],), [_RMS[0]])
        _call(b, ("aten::scaled_dot_product_attention",), [_SDPA])
        _call(b, ("aten::topk",), [_TOPK, _SORT])
        _scope(b, f"[rank0] model.layers.{layer}.mlp.experts", lambda: _call(b, ("aten::mm",), [GEMM]))
    out = tmp_path / "tl.json"
    res = CliRunner().invoke(app, ["import", str(b.write(tmp_path)), "-o", str(out)])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if "typed moe" in x]
    assert line.startswith("note: 2 GEMM kernels launched inside MoE experts scopes ('[rank0] model.layers.0.mlp")
    assert sum(1 for s in load_timeline(out).spans if s.category == "moe") == 2 + 2 * 2
