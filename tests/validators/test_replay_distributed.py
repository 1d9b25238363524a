"""Sharding under torchrun: two CPU processes with gloo split the configs, rank 0 gathers them all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from replay_helpers import FAST, gemm_graph, tiny_graph

from opgraph.ir import save_graph
from validators import ResultWriter, load_results
from validators.distributed import part_path, shard
from validators.runner import run_replay

REPO = Path(__file__).resolve().parents[2]


def test_shard_covers_everything_once() -> None:
    items = list(range(11))
    parts = [shard(items, r, 3) for r in range(3)]
    assert sorted(x for p in parts for x in p) == items
    assert parts[0][:2] == [0, 3]


def test_torchrun_two_ranks_gloo(tmp_path: Path) -> None:
    graph = save_graph(tiny_graph(), tmp_path / "tiny.json")
    out = tmp_path / "dist.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "opgraph", "replay", str(graph), "-o", str(out), "--device", "cpu", "-q",
        "--warmup-ms", "0.5", "--min-samples", "3", "--max-samples", "5", "--max-time", "0.02",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = load_results(out)
    assert len(results) == 27  # every unique config of the tiny graph, once
    assert {r.rank for r in results} == {0, 1}
    assert "2 ranks" in proc.stdout and "coverage:" in proc.stdout
    assert not list(tmp_path.glob("dist.jsonl.rank*"))


def test_resume_folds_part_files_of_an_interrupted_torchrun(tmp_path: Path) -> None:
    graph = gemm_graph()
    out = tmp_path / "r.jsonl"
    first = run_replay([graph], out=out, options=FAST, limit=1)
    done = first.results[0]
    out.unlink()
    with ResultWriter(part_path(out, 1)) as w:  # what a rank had streamed before the job died
        w.write(done)
    run = run_replay([graph], out=out, resume=True, options=FAST)
    assert run.resumed == 1 and run.new == 2
    assert len(load_results(out)) == 3
    assert not part_path(out, 1).exists()
