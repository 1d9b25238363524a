"""Op kinds of imported kernel spans: every kernel type has one, and an MoE block's kernels take the kinds a
graph lowers it into (expert GEMMs ``gemm``, routing, dispatch and combine ``moe_routing``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from opgraph.compare.align import KIND_OF_TYPE
from opgraph.ir.ops import OpKind
from opgraph.ir.timeline import KernelType, SpanCategory, Timeline
from opgraph.trace import GpuEvent, analyze, load_trace
from opgraph.trace.importer import OP_KIND_OF_TYPE, op_kind

HELDOUT = Path(__file__).resolve().parents[2] / "data" / "traces" / "heldout"
QWEN3_MOE = HELDOUT / "qwen3moe_generate_p128_d3.json.gz"


def test_every_kernel_type_has_an_op_kind() -> None:
    assert set(OP_KIND_OF_TYPE) == {kt.value for kt in KernelType}


def test_compare_keeps_moe_as_one_family() -> None:
    # compare's per-kind table sets every MoE kernel apart as "moe", as measured._family does the
    # simulated side's routing and expert GEMMs; the other types follow the importer
    assert set(KIND_OF_TYPE) == {kt.value for kt in KernelType}
    assert KIND_OF_TYPE["moe"] == "moe"
    assert {k: v for k, v in KIND_OF_TYPE.items() if k != "moe"} == {
        k: v.value for k, v in OP_KIND_OF_TYPE.items() if k != "moe"
    }


def _kernels(tl: Timeline, category: str) -> list[tuple[str, OpKind | None, str | None]]:
    return [
        (s.name, s.kind, str(s.args.get("launch_op")) if s.args.get("launch_op") is not None else None)
        for s in tl.spans
        if s.args.get("type") == "kernel" and s.category == category
    ]


def test_moe_kernels_of_a_trace_take_gemm_or_routing() -> None:
    tl = load_trace(QWEN3_MOE, cpu=False)
    assert all(s.kind is not None for s in tl.spans if s.args.get("type") == "kernel")
    moe = _kernels(tl, "moe")
    assert moe
    # what ran them, from the trace's CPU ops: the expert GEMMs (_grouped_mm in prefill, bmm over the
    # gathered expert weights in decode) and the router's top-k, the sort and histogram of the dispatch
    for name, kind, launch_op in moe:
        expected = OpKind.GEMM if launch_op in ("aten::_grouped_mm", "aten::bmm") else OpKind.MOE_ROUTING
        assert launch_op in ("aten::_grouped_mm", "aten::bmm", "aten::topk", "aten::sort", "aten::histc"), name
        assert kind is expected, (name, launch_op)


@pytest.mark.parametrize(
    ("name", "expected"),
    [  # vLLM's gpt-oss MoE through triton_kernels (no CPU ops in that trace)
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", OpKind.GEMM),
        ("_finalize_matmul_scatter_bf16", OpKind.MOE_ROUTING),
        ("_topk_forward", OpKind.MOE_ROUTING),
        ("_combined_routing_compute", OpKind.MOE_ROUTING),
        ("triton_poi_fused_constant_pad_nd_moe_forward_0", OpKind.MOE_ROUTING),
        ("fused_moe_kernel", OpKind.GEMM),
        ("void moe_align_block_size_kernel<int>(int const*, int*)", OpKind.MOE_ROUTING),
    ],
)
def test_moe_kernels_without_cpu_ops_by_name(name: str, expected: OpKind) -> None:
    assert op_kind(GpuEvent(name, SpanCategory.KERNEL, 0.0, 1.0, 0, 7, ktype=KernelType.MOE)) is expected


def test_analyze_gantt_legend_names_the_types_analyze_reports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import opgraph.export
    from opgraph.cli.app import app
    from opgraph.export.common import span_kind_key
    from tests.conftest import cli_runner

    drawn: list[Timeline] = []
    monkeypatch.setattr(opgraph.export, "write_gantt", lambda tls, *a, **k: drawn.extend(tls))
    res = cli_runner().invoke(app, ["analyze", str(QWEN3_MOE), "--gantt", str(tmp_path / "g.png")])
    assert res.exit_code == 0, res.output
    legend = Counter(span_kind_key(s) for tl in drawn for s in tl.spans)
    by_type = {b.name: b.count for b in analyze(QWEN3_MOE).by_type}
    assert legend["sampling"] == by_type["sampling"] > 0 and "topk" not in legend
    assert {k: n for k, n in legend.items() if k not in ("memcpy", "memset")} == by_type
