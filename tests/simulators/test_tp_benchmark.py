"""The TP benchmark's pieces on the CPU: sharding plan, trace reading, a 2-rank gloo run and its prediction.

``benchmarks/gpu/tp_run.py`` measures a tensor-parallel run and ``tp_predict.py`` simulates the same
job; here both run on a tiny Llama with gloo. The CUDA parts (NCCL kernel times, GPU busy time) only
exist on a GPU machine: ``benchmarks/gpu/tp_h100.sh`` runs them there.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

import tp_predict  # noqa: E402
import tp_run  # noqa: E402


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


def _meta_model(config: Path) -> Any:
    from opgraph.capture.api import CaptureOptions, prepare

    return prepare(str(config), CaptureOptions(device="meta", seq_len=16)).model


def test_plan_matches_transformers_own_llama_tp_plan(tiny_config: Path) -> None:
    """opgraph's linear rules shard Llama as transformers' ``tp_plan="auto"`` does (a peer's plan)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _meta_model(tiny_config)
    plan = {s.name: s.style for s in tp_run.tp_plan(model)}
    hf = {f"model.{k}": v for k, v in LlamaConfig.base_model_tp_plan.items()}
    hf.update(LlamaForCausalLM._tp_plan or {})
    expected: dict[str, str] = {}
    for name, _ in model.named_modules():
        for pattern, style in hf.items():
            if re.fullmatch(re.escape(pattern).replace(r"\*", r"\d+"), name):
                expected[name] = {"colwise": "column", "rowwise": "row"}.get(style, "vocab")
    assert len(expected) == 7 * TINY_LLAMA["num_hidden_layers"] + 1  # type: ignore[operator]
    assert plan == expected


def test_vocab_parallel_embedding_is_in_the_plan_only_when_asked(tiny_config: Path) -> None:
    model = _meta_model(tiny_config)
    assert "model.embed_tokens" not in {s.name for s in tp_run.tp_plan(model)}
    styles = {s.name: s.style for s in tp_run.tp_plan(model, embedding="vocab_parallel", lm_head="replicated")}
    assert styles["model.embed_tokens"] == "embedding" and "lm_head" not in styles


def test_plan_rejects_a_degree_that_splits_heads(tiny_config: Path) -> None:
    model = _meta_model(tiny_config)
    plan = tp_run.tp_plan(model)
    tp_run.check_plan(model, plan, 2)
    with pytest.raises(ValueError, match=r"k_proj: 2 heads do not split over 4 ranks"):
        tp_run.check_plan(model, plan, 4)


def test_trace_times_of_a_synthetic_trace(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 8, "dur": 6},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 20, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 30, "dur": 4},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "opgraph.tp_step", "ts": 0, "dur": 40},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::_allgather_base_", "ts": 2, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3, "dur": 1},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5},
    ]
    path = tmp_path / "rank0.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    t = tp_run.trace_times(path, steps=2)
    # Device intervals [0,10] [8,14] [20,22] [30,34]: 14 + 2 + 4 = 20 us of busy time over two steps.
    assert t.gpu_busy_us == pytest.approx(10.0)
    assert t.nccl_us == pytest.approx(5.0) and t.compute_busy_us == pytest.approx(6.0)
    assert t.nccl_by_name == {"AllReduce": 3.0, "AllGather": 2.0}
    assert t.nccl_kernel_us == (6.0, 4.0)
    assert t.kernels == 2 and t.nccl_kernels == 1
    assert tp_run.trace_times(path, steps=1).collective_calls == {"all_gather": 1, "all_reduce": 1}


def test_nccl_transfer_takes_the_shortest_rank_per_collective() -> None:
    def rank(r: int, ks: tuple[float, ...]) -> tp_run.RankResult:
        trace = tp_run.TraceTimes(
            steps=1, gpu_busy_us=1, nccl_us=sum(ks), nccl_busy_us=sum(ks), compute_busy_us=1, kernels=1,
            nccl_kernels=len(ks), nccl_kernel_us=ks,
        )  # fmt: skip
        return tp_run.RankResult(rank=r, device_name="x", wall_us=1, wall_runs_us=(1,), trace=trace)

    # Rank 1 arrived late at the first collective, rank 0 at the second: each waited once.
    assert tp_predict.nccl_transfer_us([rank(0, (50.0, 10.0)), rank(1, (10.0, 40.0))]) == 20.0
    assert tp_predict.nccl_transfer_us([rank(0, (50.0,)), rank(1, (10.0, 40.0))]) is None


@pytest.mark.slow
def test_two_rank_gloo_run_matches_its_prediction(tiny_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(REPO / "benchmarks" / "gpu" / "tp_run.py"), "--model", str(tiny_config), "--device", "cpu",
        "--dtype", "fp32", "--seq-len", "16", "--kv-len", "16", "--decode-batch", "2", "--warmup", "1",
        "--wall-repeats", "2", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = tp_run.TpRunSummary.model_validate_json((out / "summary.json").read_text())
    # The sharded model computes the unsharded model's logits (fp32: to rounding).
    assert summary.check is not None and summary.check.rel_err < 1e-5
    assert [(r.case.phase, r.case.tp) for r in summary.runs] == [("prefill", 2), ("decode", 2)]
    for run in summary.runs:
        assert [r.rank for r in run.ranks] == [0, 1]
        for r in run.ranks:
            assert r.wall_us > 0 and len(r.wall_runs_us) == 2 and (out / r.trace_file).is_file()
    report = tp_predict.run(tp_predict.parse_args(["--measured", str(out / "summary.json"), "--hardware", "h100"]))
    assert len(report.comparisons) == 2
    for c in report.comparisons:
        # The simulated rank runs the collectives the measured rank called: same sharding on both sides.
        layers = TINY_LLAMA["num_hidden_layers"]
        assert c.measured_collectives == c.predicted_collectives == {"all_gather": 1, "all_reduce": 2 * layers}
        assert len(c.ranks) == 2 and all(r.predicted_gpu_us > 0 for r in c.ranks)
        assert all(r.gpu_err is None for r in c.ranks)  # no GPU on this machine: nothing to compare


def test_compare_run_errors_are_predicted_over_measured() -> None:
    case = tp_run.TpCase(model="m", phase="decode", tp=2, batch=8, kv_len=2048)
    trace = tp_run.TraceTimes(
        steps=1, gpu_busy_us=200.0, nccl_us=50.0, nccl_busy_us=50.0, compute_busy_us=160.0, kernels=10,
        nccl_kernels=2, nccl_kernel_us=(30.0, 20.0), collective_calls={"all_reduce": 2},
    )  # fmt: skip
    measured = [tp_run.RankResult(rank=0, device_name="x", wall_us=900.0, wall_runs_us=(900.0,), trace=trace)]
    pred = tp_predict.RankPrediction(
        rank=0, gpu_us=180.0, compute_us=168.0, collective_us=40.0, collective_wait_us=5.0, makespan_us=700.0
    )
    c = tp_predict.compare_run(case, measured, [pred], "roofline", "interconnect", {"all_reduce": 2})
    r = c.ranks[0]
    assert r.gpu_err == pytest.approx(-0.1) and r.compute_err == pytest.approx(0.05)
    assert r.predicted_collective_us == 45.0 and r.collective_err == pytest.approx(-0.1)
    assert c.measured_nccl_transfer_us == 50.0 and c.transfer_err == pytest.approx(-0.2)
    assert c.max_gpu_err == pytest.approx(0.1) and c.measured_collectives == {"all_reduce": 2}
