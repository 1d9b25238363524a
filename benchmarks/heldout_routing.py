"""Capture the held-out MoE cases on the CPU with the measured model's own weights (its routing, no GPU).

    python benchmarks/heldout_routing.py DATA [-o routing_graphs.tar.gz]

``DATA`` is what ``benchmarks/gpu/heldout.py --weights-on cpu`` wrote (a folder, or its
``heldout.tar.gz``). Its cases' random weights were drawn on the CPU with a known seed and moved to the
GPU, so ``opgraph capture CONFIG --device cpu --seed SEED`` builds the same weights here, runs the
same seeded tokens and records the tokens per expert of every MoE call as the model routes them: the
graph a user with the model's weights and no GPU captures. Each MoE case is captured with that
command (the CLI as a user types it); dense cases and cases whose weights were drawn on the GPU are
left out (meta gives the same graph for a dense model; a GPU's random draws cannot be redone here).

Writes ``routing/CASE.json.gz`` per case into ``-o`` (default ``routing_graphs.tar.gz`` beside
``DATA``), where ``benchmarks/heldout_report.py`` finds it. A 2-layer Mixtral decode over a 2048-token
cache of 16 sequences takes a few minutes on 2 cores (the cache is filled by a real prefill).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.heldout_report import ROUTING_GRAPHS, ReportError, load_cases, open_data  # noqa: E402


def capture_args(folder: Path, case: dict[str, Any], out: Path) -> list[str] | None:
    """``opgraph capture`` arguments that redo ``case``'s model and phase on the CPU with its weights,
    or ``None`` when that cannot be done or changes nothing (dense, or weights drawn on the GPU)."""
    weights = case.get("weights") or {}
    config = json.loads((folder / case["config_file"]).read_text())
    experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
    if weights.get("drawn_on") != "cpu" or not experts:
        return None
    s = case["settings"]
    size = ["--seq-len", str(s["seq_len"])] if s["phase"] == "prefill" else ["--kv-len", str(s["kv_len"])]
    return [
        "capture", str(folder / case["config_file"]), "--device", "cpu", "--seed", str(weights["seed"]),
        "--phase", s["phase"], "--batch", str(s["batch"]), *size, "--dtype", s["dtype"], "-o", str(out),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="the folder or heldout.tar.gz that heldout.py --weights-on cpu wrote")
    ap.add_argument("-o", "--output", type=Path, help=f"default: {ROUTING_GRAPHS} beside DATA")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"error: {args.data} does not exist (DATA): give the folder or heldout.tar.gz", file=sys.stderr)
        return 2
    output: Path = args.output or args.data.parent / ROUTING_GRAPHS
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = open_data(args.data, Path(tmp) / "data")
        except ReportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        _, cases = load_cases(folder)
        graphs = Path(tmp) / "routing"
        graphs.mkdir()
        done = 0
        for case in cases:
            cli = capture_args(folder, case, graphs / f"{case['case']}.json.gz")
            if cli is None:
                continue
            t0 = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "opgraph", *cli], capture_output=True, text=True, cwd=REPO)
            if run.returncode:
                print(f"error: {case['case']}: opgraph capture failed: {run.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            print(f"{case['case']}: captured on the CPU in {time.perf_counter() - t0:.0f} s", flush=True)
            done += 1
        if not done:
            print(f"error: {args.data}: no MoE case with weights drawn on the CPU (heldout.py --weights-on cpu)",
                  file=sys.stderr)  # fmt: skip
            return 2
        partial = output.with_name(f".{output.name}.partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(graphs, arcname="routing")
        partial.replace(output)
    print(f"wrote {output} ({done} graphs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
