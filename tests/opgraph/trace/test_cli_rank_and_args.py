"""``--rank`` of a trace that lacks the rank, and ``analyze``'s argument checks and summary labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from opgraph.cli.app import app
from opgraph.ir import OpgraphError
from opgraph.trace import load_trace
from tests.conftest import cli_runner

HELDOUT = Path(__file__).resolve().parents[2] / "data" / "traces" / "heldout"
LLAMA_SDPA = HELDOUT / "llama1b_sdpa_prefill512.json.gz"
"""Llama 3.2 1B (GQA: 32 query heads, 8 key/value heads), one prefill of 2 layers; no distributedInfo."""


def one_error_line(res: Result) -> str:
    """The one ``error: ...`` line of a refused call (exit 2, no traceback)."""
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.stderr)
    assert lines[0].startswith("error: ")
    return lines[0]


def _one_kernel_trace(tmp_path: Path, **meta: Any) -> Path:
    kernel = {
        "ph": "X",
        "cat": "kernel",
        "name": "void at::native::vectorized_elementwise_kernel<4>",
        "pid": 0,
        "tid": 7,
        "ts": 10.0,
        "dur": 2.0,
        "args": {"device": 0, "stream": 7},
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**meta, "traceEvents": [kernel]}))
    return path


@pytest.mark.parametrize("rank", ["1", "7"])
def test_import_refuses_a_rank_a_single_rank_trace_lacks(tmp_path: Path, rank: str) -> None:
    out = tmp_path / "r.json"
    res = cli_runner().invoke(app, ["import", str(LLAMA_SDPA), "--rank", rank, "-o", str(out)])
    line = one_error_line(res)
    assert f"no rank {rank}" in line and "ranks: [0]" in line
    assert not out.exists()


def test_rank_zero_selects_a_single_rank_trace_without_rank_info(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = cli_runner().invoke(app, ["import", str(LLAMA_SDPA), "--rank", "0", "-o", str(out), "--kernels-only"])
    assert res.exit_code == 0, res.output
    assert load_trace(LLAMA_SDPA, cpu=False, rank=0).spans == load_trace(LLAMA_SDPA, cpu=False).spans


def test_a_single_rank_trace_holds_the_rank_its_distributed_info_names(tmp_path: Path) -> None:
    path = _one_kernel_trace(tmp_path, distributedInfo={"rank": 3, "world_size": 4})
    assert load_trace(path, rank=3).spans
    with pytest.raises(OpgraphError, match=r"no rank 0 in the trace.*ranks: \[3\]"):
        load_trace(path, rank=0)


def test_import_refuses_a_negative_rank(tmp_path: Path) -> None:
    one_error_line(cli_runner().invoke(app, ["import", str(LLAMA_SDPA), "--rank", "-1", "-o", str(tmp_path / "r")]))


@pytest.mark.parametrize("top", ["0", "-3"])
def test_analyze_refuses_a_top_below_one(top: str) -> None:
    assert "--top" in one_error_line(cli_runner().invoke(app, ["analyze", str(LLAMA_SDPA), "-v", "--top", top]))


@pytest.mark.parametrize("layers", ["2", "999", "0,-1"])
def test_analyze_refuses_debug_layers_it_did_not_find(layers: str) -> None:
    res = cli_runner().invoke(app, ["analyze", str(LLAMA_SDPA), "--debug-layers", layers])
    line = one_error_line(res)
    assert "--debug-layers" in line and "0..1" in line  # the trace's 2 layers
    assert res.stdout == ""  # refused before the report


def test_analyze_debug_layers_in_range_print_the_layers() -> None:
    res = cli_runner().invoke(app, ["analyze", str(LLAMA_SDPA), "--debug-layers", "0,1"])
    assert res.exit_code == 0, res.output
    assert "layer 0 (pass 0" in res.stdout and "layer 1 (pass 0" in res.stdout


def test_analyze_does_not_call_gqa_mha() -> None:
    res = cli_runner().invoke(app, ["analyze", str(LLAMA_SDPA)])
    assert res.exit_code == 0, res.output
    assert "attention: MHA/GQA" in res.stdout
