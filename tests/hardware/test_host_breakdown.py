"""The held-out trace breakdown (benchmarks/gpu/host_breakdown.py --traces) puts each host interval
of a profiled forward in its region: issuing calls, other calls, Python between them."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from tests.conftest import REPO


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("host_breakdown", REPO / "benchmarks" / "gpu" / "host_breakdown.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_breakdown"] = module
    spec.loader.exec_module(module)
    return module


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_regions_split_issue_other_calls_and_python() -> None:
    events = [
        _x("heldout_run_0", 0, 1000, "user_annotation"),
        _x("heldout_mod:", 10, 900, "user_annotation"),
        _x("aten::embedding", 50, 30),  # preamble: 40 us of Python before it, issues a kernel
        _x("cudaLaunchKernel", 60, 5, "cuda_runtime"),
        _x("aten::view", 90, 2),  # a call that launches nothing
        _x("heldout_mod:model.layers.0", 200, 500, "user_annotation"),
        _x("heldout_mod:model.layers.0.mlp", 210, 100, "user_annotation"),  # a submodule: not a layer
        _x("aten::mm", 220, 50),
        _x("aten::t", 222, 3),  # nested in the mm: not a top-level call
        _x("cuLaunchKernelEx", 260, 6, "cuda_driver"),
        _x("aten::mm", 800, 40),  # after the layers
        _x("cudaLaunchKernel", 810, 5, "cuda_runtime"),
        _x("gemm_kernel", 300, 120, "kernel", tid=7),
    ]
    r = _module().trace_regions(events)
    assert list(r) == ["before model", "preamble", "layer 0", "after layers", "after return", "run"]
    assert r["before model"]["us"] == 10
    assert r["preamble"] == pytest.approx(
        {"us": 190, "issue_us": 30, "other_calls_us": 2, "between_us": 158, "issuing_calls": 1}
    )
    assert r["layer 0"]["issue_us"] == 50 and r["layer 0"]["between_us"] == 450
    assert r["after layers"]["issue_us"] == 40 and r["after layers"]["us"] == 210
    assert r["after return"]["us"] == 90
    assert r["run"] == {"us": 1000, "device_busy_us": 120}
