"""The ``nn.Module: ...`` Python events of a trace recorded ``with_stack=True``: kept on import (other Python
events are not), so the CLI's ``import`` and ``analyze`` read an experts module's scope around its per-expert
GEMMs (the ``[layers] experts`` rule) as they read a ``record_function`` range."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import load_timeline
from opgraph.trace import KernelType, analyze, load_trace_data
from opgraph.trace.analysis import Analyzer
from tests.conftest import TRACES
from tests.opgraph.trace.test_classify import _RMS, _SORT, _TOPK, GEMM, PS, _Builder, _ev
from tests.opgraph.trace.test_expert_loops import (
    _SDPA,
    _call,
    _grouped_mm_kernels,
    _heldout_case,
    _moe_kernels,
    _without_grouped_mm,
)

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
STACK_FRAME = "transformers/models/qwen3_moe/modeling_qwen3_moe.py(300): forward"
"""A Python stack event that is no module call: left out."""


def _module(b: _Builder, name: str, body: Callable[[], None]) -> None:
    """The ``nn.Module`` Python event named ``name`` around what ``body`` launches, and one Python stack frame
    inside it, as ``with_stack=True`` records a module call (same thread as its CPU ops)."""
    start = b.t
    body()
    b.events.append(_ev("python_function", name, start - 0.5, b.t - start, **{"Python id": 1}))
    b.events.append(_ev("python_function", STACK_FRAME, start - 0.4, 0.2))


def _moe_trace(tmp_path: Path, layers: int = 2, experts: int = 3) -> Path:
    """``layers`` MoE layers without input shapes whose experts module (``Qwen3MoeExperts``) runs one
    ``aten::mm`` per expert: only the module's scope says the GEMMs are MoE."""
    b = _Builder()
    for layer in range(layers):
        _call(b, (_RMS[1],), [_RMS[0]])
        _call(b, ("aten::scaled_dot_product_attention",), [_SDPA])
        _call(b, ("aten::linear", "aten::mm"), [GEMM])  # the router: a GEMM outside the experts module
        _call(b, ("aten::topk",), [_TOPK, _SORT])

        def loop() -> None:
            for _ in range(experts):
                _call(b, ("aten::mm",), [GEMM])

        _module(b, f"nn.Module: Qwen3MoeExperts_{layer}", loop)
    return b.write(tmp_path)


def _types(data: Any) -> list[KernelType]:
    Analyzer(PS).labels(data)
    return [g.ktype for g in data.gpu if g.kind == "kernel"]


def test_module_events_are_kept_and_other_python_events_are_not(tmp_path: Path) -> None:
    path = _moe_trace(tmp_path)
    (data,) = load_trace_data(path)
    python = [h.name for h in data.host if h.kind == "python"]
    assert python == ["nn.Module: Qwen3MoeExperts_0", "nn.Module: Qwen3MoeExperts_1"]
    (note,) = [n for n in data.notes if "python_function" in n]
    assert note.startswith("2 python_function events other than nn.Module scopes not imported")
    (everything,) = load_trace_data(path, python=True)
    assert sum(h.kind == "python" for h in everything.host) == 4
    (none,) = load_trace_data(path, modules=False)
    assert not [h for h in none.host if h.kind == "python"]


def test_gemms_inside_an_experts_module_event_are_moe(tmp_path: Path) -> None:
    path = _moe_trace(tmp_path)
    (data,) = load_trace_data(path)
    types = _types(data)
    assert types.count(KernelType.GEMM) == 2  # the routers
    # per layer: top-k and sort (their own rule) and the 3 experts' GEMMs (the module's scope)
    assert types.count(KernelType.MOE) == 2 * (2 + 3)
    (without,) = load_trace_data(path, modules=False)
    assert _types(without).count(KernelType.MOE) == 2 * 2  # without the module events the loop stays gemm


def test_cli_import_and_analyze_read_the_module_scope(tmp_path: Path) -> None:
    path = _moe_trace(tmp_path)
    runner = CliRunner(env=ENV)
    out = tmp_path / "tl.json"
    res = runner.invoke(app, ["import", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if "typed moe" in x]
    assert line.startswith("note: 6 GEMM kernels launched inside MoE experts scopes ('nn.Module: Qwen3MoeExperts_0'")
    assert "python=True" not in res.output  # the CLI's words for the Python events it leaves out
    tl = load_timeline(out)
    assert sum(s.category == "moe" for s in tl.spans) == 2 * (2 + 3)
    assert [s.name for s in tl.spans if s.category == "python"] == [
        "nn.Module: Qwen3MoeExperts_0",
        "nn.Module: Qwen3MoeExperts_1",
    ]
    # the saved timeline, analysed again, still has the module scopes (not only the CPU ops' names)
    assert next(b.count for b in analyze(tl).by_type if b.name == "moe") == 2 * (2 + 3)
    res = runner.invoke(app, ["analyze", str(path), "--json"])
    assert res.exit_code == 0, res.output
    by_type = {b["name"]: b["count"] for b in json.loads(res.output)["by_type"]}
    assert by_type["moe"] == 2 * (2 + 3) and by_type["gemm"] == 2


def test_a_shared_expert_module_is_no_experts_scope(tmp_path: Path) -> None:
    b = _Builder()
    _call(b, ("aten::topk",), [_TOPK, _SORT])
    _module(b, "nn.Module: Qwen2MoeSharedExperts_0", lambda: _call(b, ("aten::mm",), [GEMM]))
    (data,) = load_trace_data(b.write(tmp_path))
    assert _types(data).count(KernelType.GEMM) == 1


# ---- real traces


def _module_events(path: Path) -> list[str]:
    """Names of the trace's ``nn.Module`` Python events, read with the standard library: the file's own count."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sorted(
        e["name"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "python_function" and str(e.get("name")).startswith("nn.Module:")
    )


WITH_MODULES = [
    "TraceLens__h100_Qwen1.5-0.5B-Chat.json.gz",
    "TraceLens__h100_timesformer-base.json.gz",
    "TraceLens__sglang_Qwen3-8B_prefilldecode.json.gz",
]
"""Shared traces recorded with ``with_stack=True`` (their modules' Python events); none runs an eager
experts loop."""


@pytest.mark.parametrize("name", WITH_MODULES)
def test_real_traces_keep_exactly_their_module_events_and_type_kernels_as_before(name: str) -> None:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"trace {name} not found in {TRACES} (shared data lives beside the repo)")
    expected = _module_events(path)
    if not expected:
        pytest.skip(f"{name} holds no nn.Module Python events")
    (data,) = load_trace_data(path)
    assert sorted(h.name for h in data.host if h.kind == "python") == expected
    (without,) = load_trace_data(path, modules=False)
    assert _types(data) == _types(without)  # no experts module here: every kernel keeps its type


def test_real_fp16_expert_gemms_are_moe_from_their_module_events(tmp_path: Path) -> None:
    """No shared trace records an eager experts loop with its module's Python event; the held-out fp16
    Qwen3-MoE prefill does with ``record_function`` ranges. Recorded as ``with_stack=True`` would record them
    (``nn.Module: Qwen3MoeExperts_<n>`` Python events on the same thread), its experts' GEMMs are typed moe
    through the CLI, as the trace's own ``_grouped_mm`` calls say."""
    trace, _ = _heldout_case()
    truth = _grouped_mm_kernels(trace, tmp_path)
    ranges = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].endswith(".experts")]
    assert len(ranges) == 2
    modules = [
        {**e, "cat": "python_function", "name": f"nn.Module: Qwen3MoeExperts_{i}", "args": {"Python id": i}}
        for i, e in enumerate(ranges)
    ]
    recorded = _without_grouped_mm(trace, drop_scopes=True)
    recorded = {**recorded, "traceEvents": recorded["traceEvents"] + modules}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(recorded))
    assert _moe_kernels(path) == truth
    res = CliRunner(env=ENV).invoke(app, ["analyze", str(path)])
    assert res.exit_code == 0, res.output
    assert "462 GEMM kernels launched inside MoE experts scopes ('nn.Module: Qwen3MoeExperts_0'" in res.output
