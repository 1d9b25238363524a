"""The analyzer on every real trace in ../shared/data/traces, against the ground truth in its README."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from opgraph.compare import compare_timelines
from opgraph.export import write_perfetto
from opgraph.export.stats import summarize
from opgraph.ir import Timeline
from opgraph.trace import AnalysisResult, analyze, analyze_full, from_timeline, load_trace, to_timeline

TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces").resolve()

LLAMA = "hf-llama-1b-like-h200-prefill512-decode8.json.gz"
QWEN_MOE = "hf-qwen3-moe-small-h200-prefill256-decode4.json.gz"
SGL_PREFILL = "TraceLens__sglang_Qwen3-8B_prefilldecode.json.gz"
SGL_DECODE = "TraceLens__sglang_Qwen3-8B_decode.json.gz"
VLLM_MIXED = "TraceLens__vllm_prefilldecode_piecewise__graph_execution.json.gz"
VLLM_DECODE = "TraceLens__vllm_decode_full__graph_execution.json.gz"
DLRM = "param__dlrm_kineto.tar.gz"
QWEN_H100 = "TraceLens__h100_Qwen1.5-0.5B-Chat.json.gz"
TIMESFORMER = "TraceLens__h100_timesformer-base.json.gz"

# (passes, layers per pass, passes per stage, layer kind) from the README's ground truth
TRUTH: dict[str, tuple[int, int, dict[str, int], str]] = {
    LLAMA: (8, 16, {"prefill": 1, "decode": 7}, "MHA_FC"),
    QWEN_MOE: (4, 8, {"prefill": 1, "decode": 3}, "MHA_MOE"),
    SGL_PREFILL: (1, 36, {"prefill": 1}, "MHA_FC"),
    SGL_DECODE: (1, 36, {"decode": 1}, "MHA_FC"),
    VLLM_MIXED: (1, 24, {"mixed": 1}, "MHA_MOE"),
    VLLM_DECODE: (1, 24, {"decode": 1}, "MHA_MOE"),
    # one forward inside ProfilerStep#6; the previous step's kernels at the window's start are set apart
    QWEN_H100: (1, 24, {"prefill": 1}, "MHA_FC"),
    # eager attention (bmm, softmax, bmm), temporal and spatial attention in each of 12 layers; not an LLM:
    # one forward over the whole sequence (query length > 1 in its bmm shapes) reads as a prefill
    TIMESFORMER: (1, 12, {"prefill": 1}, "MHA_FC"),
}


def _path(name: str) -> Path:
    p = TRACES / name
    if not p.exists():
        pytest.skip(f"real trace {name} not found in {TRACES} (shared data lives beside the repo)")
    return p


@cache
def _result(name: str) -> AnalysisResult:
    return analyze(_path(name))


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_layers_passes_stages_match_ground_truth(name: str) -> None:
    passes, layers, stages, kind = TRUTH[name]
    r = _result(name)
    assert r.complete
    assert len(r.passes) == passes
    assert r.layers_per_pass == (layers,) * passes
    assert r.stage_passes == stages
    assert {x.kind for x in r.layers} == {kind}
    assert r.attention == "mha"
    assert r.unknown_pct < 1.0
    # every kernel inside a layer inherits the layer's stage, and the per-stage counts add up
    assert sum(b.count for b in r.by_stage) == r.kernels == sum(b.count for b in r.by_type)
    assert abs(sum(b.pct for b in r.by_type) - 100.0) < 0.01


def test_hf_llama_stages_come_from_attention_shapes_in_order() -> None:
    r = _result(LLAMA)
    assert [p.stage for p in r.passes] == ["prefill"] + ["decode"] * 7
    assert {p.stage_source for p in r.passes} == {"shape"}
    # prefill: one pass of 512 tokens costs more per layer than any decode pass
    per_layer = [p.time_us / p.layers for p in r.passes]
    assert per_layer[0] > max(per_layer[1:])
    assert r.half_layers_merged
    assert {x.norms for x in r.layers} == {2}  # input + post-attention RMSNorm per block


def test_kernels_launched_before_the_profiler_window_are_set_apart() -> None:
    r = _result(QWEN_H100)
    # the window opens inside a step: its first 509 device events have no launch in the trace
    assert r.window_events == 509
    assert 13_000 < r.window_time_us < 14_500
    assert any("before the profiler window opened" in n for n in r.notes)
    assert r.passes[0].annotation == "ProfilerStep#6"
    # they are in no pass, and left out of the totals and tables: all that is counted is the one pass
    assert r.passes[0].kernels == r.kernels == sum(b.count for b in r.by_type) == sum(b.count for b in r.by_stage)
    assert {b.name for b in r.by_stage} == {"prefill"}
    _, raw_us, _ = _raw_device(QWEN_H100)
    assert r.kernel_time_us + r.memcpy_time_us + r.window_time_us == pytest.approx(raw_us, rel=1e-9)


TRACELENS_REPORT = TRACES / "tracelens-h100-qwen1.5-0.5b"
"""TraceLens's own report of the H100 Qwen1.5 trace (a peer's answer)."""


def _tracelens(name: str) -> list[dict[str, str]]:
    if not (TRACELENS_REPORT / name).exists():
        pytest.skip(f"TraceLens's report {name} not found in {TRACELENS_REPORT}")
    with (TRACELENS_REPORT / name).open() as f:
        return list(csv.DictReader(f))


def test_headline_of_a_trace_with_set_apart_kernels_agrees_with_tracelens() -> None:
    r = _result(QWEN_H100)
    timeline = {row["type"]: float(row["time ms"]) * 1000 for row in _tracelens("gpu_timeline.csv")}
    # TraceLens leaves out the earlier step's tail too: busy, and busy + idle from first to last event
    assert r.gpu_busy_us == pytest.approx(timeline["busy_time"], rel=0.001)
    assert r.makespan_us == pytest.approx(timeline["total_time"], rel=0.001)
    # one GEMM kernel per GEMM call TraceLens counts (aten::mm's memsets are not kernels)
    gemm_calls = sum(int(row["name_count"]) for row in _tracelens("GEMM.csv"))
    assert {b.name: b.count for b in r.by_type}["gemm"] == gemm_calls == 169


def test_eager_attention_is_attention_and_temporal_spatial_blocks_are_one_layer() -> None:
    r = _result(TIMESFORMER)
    types = {b.name: b.count for b in r.by_type}
    # per layer: temporal and spatial attention, each bmm + softmax + bmm with scale and copies between
    assert types["attention"] >= 12 * 2 * 3
    assert all(x.attention_us > 0 and x.gemm_us > 0 for x in r.layers)
    assert not any("one pass assumed" in n for n in r.notes)


def test_timesformer_both_bmm_of_each_eager_attention_are_attention_and_copies_no_gemm() -> None:
    _, datas, rank_labels = analyze_full(_path(TIMESFORMER))
    gpu, labels = datas[0].gpu, rank_labels[0]
    # 12 layers x (temporal, spatial) attention x (scores, values): every aten::bmm, each in a layer
    bmm = [j for j, g in enumerate(gpu) if g.launch_op == "aten::bmm"]
    assert len(bmm) == 12 * 2 * 2
    assert {gpu[j].ktype for j in bmm} == {"attention"}
    assert Counter(labels[j][0] for j in bmm) == dict.fromkeys(range(12), 4)
    # the copies aten::matmul makes of its strided inputs are copies, whatever op encloses them
    copies = [g for g in gpu if g.launch_op == "aten::copy_"]
    assert len([g for g in copies if "aten::matmul" in g.launch_stack]) == 12 * 2 * 3
    assert "gemm" not in {g.ktype for g in copies}


def test_hf_qwen3_moe_has_moe_in_every_layer() -> None:
    r = _result(QWEN_MOE)
    assert len(r.layers) == 32
    assert all(x.kind == "MHA_MOE" and x.moe_us > 0 for x in r.layers)
    assert {x.norms for x in r.layers} == {4}  # input, q_norm, k_norm, post-attention
    # router top-k inside layers is MoE; the LM head's argmax outside them is sampling
    types = {b.name: b.count for b in r.by_type}
    assert types["sampling"] == 4


def test_hf_qwen3_moe_expert_gemms_are_moe_in_prefill_and_decode() -> None:
    _, datas, rank_labels = analyze_full(_path(QWEN_MOE))
    gpu, labels = datas[0].gpu, rank_labels[0]
    # prefill runs the experts as aten::_grouped_mm, decode as aten::bmm over the top-8 experts' weights
    # gathered from the [64, n, k] stacks: gate_up and down, in each of 8 layers of 3 decode passes
    expert_bmm = [j for j, g in enumerate(gpu) if g.launch_op == "aten::bmm" and g.launch_dims[0][0] == 8]
    grouped = [j for j, g in enumerate(gpu) if g.launch_op == "aten::_grouped_mm"]
    assert len(expert_bmm) == 3 * 8 * 2 and len(grouped) == 8 * 2 * 2
    assert {labels[j][1] for j in expert_bmm} == {"decode"} and {labels[j][1] for j in grouped} == {"prefill"}
    assert {gpu[j].ktype for j in expert_bmm + grouped} == {"moe"}
    # each decode layer holds its two; RoPE's batch-1 bmm before the first layer of each pass is no expert's
    assert Counter(labels[j][0] for j in expert_bmm) == dict.fromkeys(range(8, 32), 2)
    rope = [g for g in gpu if g.launch_op == "aten::bmm" and g.launch_dims[0][0] == 1]
    assert len(rope) == 4 and {g.ktype for g in rope} == {"gemm"}


def test_step_annotations_give_stage_and_tokens() -> None:
    r = _result(SGL_PREFILL)
    (p,) = r.passes
    assert p.stage_source == "annotation"
    assert p.annotation.startswith("step[EXTEND")
    assert p.tokens == 15360  # from the enclosing execute_15360_... annotation
    m = _result(VLLM_MIXED).passes[0]
    assert m.stage == "mixed" and m.tokens == 8192


def test_split_half_layers_doubles_layers() -> None:
    r = analyze(_path(SGL_DECODE), split_half_layers=True)
    assert len(r.layers) == 72
    assert Counter(x.kind for x in r.layers) == {"ATTN": 36, "FC": 36}
    assert r.split_half_layers


def test_dlrm_ranks_collectives_and_alignment() -> None:
    r = analyze(_path(DLRM))
    assert len(r.ranks) == 8
    assert [x.rank for x in r.ranks] == list(range(8))
    for rank in r.ranks:
        counts: Counter[str] = Counter()
        for c in rank.collectives:
            key = "allreduce" if c.name.startswith("ncclKernel_AllReduce") else c.name
            counts[key] += c.count
        assert counts == {"allreduce": 3, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": 5}
        assert rank.residual_us < 5.0  # collectives end together once clocks are aligned
    assert r.attention == "none" and not r.layers


def test_dlrm_merged_timeline_has_rank_tracks() -> None:
    tl = load_trace(_path(DLRM), cpu=False)
    prefixes = {s.track.split("/")[0] for s in tl.spans}
    assert prefixes == {f"rank{i}" for i in range(8)}
    nccl = [s for s in tl.spans if s.category == "communication"]
    assert len(nccl) == 8 * 8
    one = load_trace(_path(DLRM), cpu=False, rank=3)
    assert one.source.config["rank"] == 3


def test_timeline_roundtrip_gives_the_same_analysis() -> None:
    path = _path(QWEN_MOE)
    direct, datas, labels = analyze_full(path)
    tl = to_timeline(datas[0], labels=labels[0])
    again = analyze(tl)
    assert again.layers_per_pass == direct.layers_per_pass
    assert again.stage_passes == direct.stage_passes
    assert [b.model_dump() for b in again.by_type] == [b.model_dump() for b in direct.by_type]
    kernels = [s for s in tl.spans if s.args.get("type") == "kernel"]
    assert {s.stage for s in kernels if s.layer is not None} == {"prefill", "decode"}
    assert max(s.layer for s in kernels if s.layer is not None) == 31
    assert {s.step for s in kernels if s.step is not None} == {0, 1, 2, 3}
    # links survive: every kernel knows the CPU op that launched it
    assert all(s.args.get("launch_op") for s in kernels)
    assert len(from_timeline(tl).gpu) == len(datas[0].gpu)


def test_amd_empty_device_name_is_reported() -> None:
    r = _result(VLLM_DECODE)
    assert r.device.startswith("AMD GPU")
    assert any("empty device name" in n for n in r.notes)


def _summary(r: AnalysisResult) -> dict[str, Any]:
    return {
        "device": r.device,
        "complete": r.complete,
        "kernels": r.kernels,
        "memcpy": r.memcpy,
        "passes": [[p.stage, p.stage_source, p.layers, p.kernels] for p in r.passes],
        "layers_per_pass": list(r.layers_per_pass),
        "attention": r.attention,
        "half_layers_merged": r.half_layers_merged,
        "layer_kinds": dict(Counter(x.kind for x in r.layers)),
        "by_type": {b.name: [b.count, round(b.time_us, 1)] for b in r.by_type},
        "by_stage": {b.name: b.count for b in r.by_stage},
        "unknown_pct": round(r.unknown_pct, 2),
        "orphan_kernels": r.orphan_kernels,
        "unique_kernels": len(r.unique_kernels),
        "top_kernels": [[u.short_name, u.type, u.count] for u in r.unique_kernels[:5]],
        "collectives": {c.name: c.count for c in r.collectives},
    }


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_golden_summaries(name: str, golden: Any) -> None:
    golden(f"trace/{name.split('.')[0]}.json", _summary(_result(name)))


# --- device time: kernels and device copies only, summed from the raw JSON, not through the importer

DEVICE_TIME_TRACES = (VLLM_DECODE, LLAMA, SGL_DECODE, QWEN_H100)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Kineto's ``cat`` of device work."""


@cache
def _raw_device(name: str) -> tuple[Counter[str], float, int]:
    """(names of the device events, their summed duration, host events) read straight from the raw JSON."""
    with gzip.open(_path(name), "rt") as f:
        events = json.load(f)["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation")]
    return Counter(e["name"] for e in device), sum(float(e["dur"]) for e in device), len(host)


@cache
def _timeline(name: str) -> Timeline:
    return load_trace(_path(name))


@pytest.mark.parametrize("name", DEVICE_TIME_TRACES)
def test_device_time_of_real_traces_is_their_kernel_and_copy_time(name: str) -> None:
    names, raw_us, n_host = _raw_device(name)
    n_raw = names.total()
    tl = _timeline(name)
    assert n_host and len(tl.spans) > n_raw  # the timeline holds host spans that must not count
    summary = summarize(tl)
    assert summary.device_spans == n_raw
    assert summary.device_time_us == pytest.approx(raw_us, rel=1e-9)
    assert sum(r.total_us for r in summary.by_kind) == pytest.approx(raw_us, rel=1e-9)
    assert sum(r.total_us for r in summary.by_layer) == pytest.approx(raw_us, rel=1e-9)
    assert compare_timelines(tl, tl).row("gpu_time").reference_us == pytest.approx(raw_us, rel=1e-9)


@pytest.mark.parametrize("name", DEVICE_TIME_TRACES[:2])
def test_perfetto_export_of_real_traces_marks_only_device_work_as_device(name: str, tmp_path: Path) -> None:
    names, raw_us, _ = _raw_device(name)
    out = write_perfetto([_timeline(name)], tmp_path / "t.json", counter_bins=0)
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    device = [e for e in events if e["cat"] in DEVICE_CATS]
    assert Counter(e["name"] for e in device) == names  # no runtime call or annotation among them
    # rounding to whole nanoseconds moves each duration by at most 1 ns
    assert sum(e["dur"] for e in device) == pytest.approx(raw_us, abs=1e-3 * names.total())


def test_hta_sees_only_the_kernels_of_an_exported_trace_as_gpu_work(tmp_path: Path) -> None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:
        pytest.skip(f"HolisticTraceAnalysis cannot be imported: {exc}")
    name = VLLM_DECODE
    names, raw_us, _ = _raw_device(name)
    n_raw = names.total()
    write_perfetto([_timeline(name)], tmp_path / "rank0.json", counter_bins=0)
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    df = analysis.t.get_trace(0)
    gpu = df[df["stream"] >= 0]  # HTA puts CPU events on stream -1
    assert len(gpu) == n_raw
    # HTA rounds times to whole microseconds
    assert float(gpu["dur"].sum()) == pytest.approx(raw_us, abs=n_raw)
