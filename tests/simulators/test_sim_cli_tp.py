"""``opgraph simulate --tp N`` shards a captured graph Megatron-style and simulates real collectives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from opgraph.cli.app import app
from opgraph.ir import OpKind, load_timeline, save_graph


@pytest.fixture(scope="module")
def llama70b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from opgraph.capture import capture

    path = tmp_path_factory.mktemp("tp") / "llama70b_decode.json"
    save_graph(capture("llama-3.1-70b", phase="decode", batch=8, kv_len=2048, layers=2), path)
    return path


def _sim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["simulate", *map(str, args)])


def _stats(*args: str | Path) -> dict[str, Any]:
    r = _sim(*args, "--json")
    assert r.exit_code == 0, r.output
    data: dict[str, Any] = json.loads(r.output)
    return data


def test_tp2_shards_and_beats_tp1(llama70b: Path, tmp_path: Path) -> None:
    one = _stats(llama70b, "-H", "h100")
    out = tmp_path / "tp2.json"
    two = _stats(llama70b, "-H", "h100", "--tp", "2", "-o", out)
    assert float(two["makespan_us"]) < float(one["makespan_us"])
    notes = " ".join(two["notes"])
    assert "graph sharded for tensor parallelism (tp=2" in notes and "all_reduce" in notes
    timeline = load_timeline(out)
    links = [s for s in timeline.spans if "link" in s.track]
    assert {s.track for s in links} == {"rank0/link0", "rank1/link0"}
    # Collectives run on the link tracks only, at the same time on both ranks.
    per_rank: dict[str, list[tuple[int | None, float]]] = {}
    for s in links:
        per_rank.setdefault(s.track, []).append((s.op_id, s.start_us))
    assert sorted(per_rank["rank0/link0"]) == sorted(per_rank["rank1/link0"])
    assert len(per_rank["rank0/link0"]) == 2 * 2 + 1 + 1  # o_proj and down_proj per layer, embedding, logits
    compute_ids = {s.op_id for s in timeline.spans if "compute" in s.track}
    assert not compute_ids & {op_id for op_id, _ in per_rank["rank0/link0"]}


def test_tp2_text_output_says_the_graph_was_sharded(llama70b: Path) -> None:
    r = _sim(llama70b, "-H", "h100", "--tp", "2")
    assert r.exit_code == 0, r.output
    assert "note: graph sharded for tensor parallelism" in " ".join(r.output.split())


def test_no_shard_keeps_the_replicated_graph(llama70b: Path) -> None:
    one = _stats(llama70b, "-H", "h100")
    rep = _stats(llama70b, "-H", "h100", "--tp", "2", "--no-shard")
    assert rep["makespan_us"] == one["makespan_us"]
    assert not any("sharded" in n for n in rep["notes"])
    by_kind = rep["by_kind"]
    assert isinstance(by_kind, dict) and OpKind.COLLECTIVE.value not in by_kind


def test_graph_with_collectives_is_not_sharded_again(llama70b: Path, tmp_path: Path) -> None:
    from opgraph.ir import load_graph
    from opgraph.transforms import shard_tensor_parallel

    pre = tmp_path / "pre.json"
    save_graph(shard_tensor_parallel(load_graph(llama70b), 2), pre)
    direct = _stats(pre, "-H", "h100", "--tp", "2")
    via_cli = _stats(llama70b, "-H", "h100", "--tp", "2")
    assert direct["makespan_us"] == via_cli["makespan_us"]
    assert not any("sharded" in n for n in direct["notes"])


def test_non_divisible_tp_is_one_line_exit_2(llama70b: Path) -> None:
    r = _sim(llama70b, "-H", "h100", "--tp", "3")
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: op ")
    assert "heads=64 is not divisible by tp=3" in lines[0]
