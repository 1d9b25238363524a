"""Replay overhead on the CPU: config dedup of a large graph, and the per-config cost of replay itself.

Two numbers a user waits on apart from the ops: ``unique_configs`` over a 100k-op graph (target
under 2 s) and the overhead of replaying one small config (recipe selection, input building,
float64 check, timing loop with the sample cap, the flushed JSONL line; target under 50 ms with
the quick timing settings). GPU timings come from ``benchmarks/gpu/replay_h100.sh``.

    python benchmarks/bench_replay.py            # 100k ops, 200 configs
    python benchmarks/bench_replay.py --smoke    # 5k ops, 20 configs, a few seconds (CI)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _common import RESULTS, machine

TARGET_DEDUP_S = 2.0
TARGET_PER_CONFIG_MS = 50.0


def main() -> None:
    """Run the benchmark and write ``benchmarks/results/replay[_smoke].{md,json}``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    args = ap.parse_args()
    n_ops, n_configs = (5_000, 20) if args.smoke else (100_000, 200)

    from opgraph.ir import AtenCall, DType, Elementwise, GraphMetadata, OpGraph, TensorSpec
    from validators import ResultWriter, TimingConfig, cost_estimator, replay_configs, unique_configs
    from validators.replay import ReplayOptions

    def add(i: int, n: int) -> Elementwise:
        # A tiny op, so the measured time is replay's own overhead rather than the op's.
        spec = TensorSpec(shape=(4, n), dtype=DType.fp32)
        return Elementwise(
            id=i, target="aten.add.Tensor", fn="add", numel=4 * n, hidden=n, scope=f"model.layers.{i % 80}.mlp",
            layer=i % 80, dtype=DType.fp32, inputs=(spec, spec), call=AtenCall(args=({"tensor": 0}, {"tensor": 1})),
        )  # fmt: skip

    ops = tuple(add(i, 8 * (1 + i % n_configs)) for i in range(n_ops))
    graph = OpGraph(metadata=GraphMetadata(model="bench"), ops=ops)
    t0 = time.perf_counter()
    configs = unique_configs(graph, estimate=cost_estimator())
    dedup_s = time.perf_counter() - t0
    assert len(configs) == n_configs

    options = ReplayOptions(
        timing=TimingConfig(warmup_ms=0.5, min_warmup=1, min_samples=3, max_samples=5, max_time_s=0.01)
    )
    with tempfile.TemporaryDirectory() as tmp:
        list(replay_configs(configs[:2], "cpu", options))  # imports and first-call costs
        t0 = time.perf_counter()
        with ResultWriter(Path(tmp) / "r.jsonl") as w:
            results = list(replay_configs(configs, "cpu", options, writer=w))
        replay_s = time.perf_counter() - t0
    per_config_ms = replay_s / len(configs) * 1e3
    op_ms = sum(r.timing.median_us * r.timing.samples for r in results if r.timing) / 1e3 / len(configs)
    data = {
        "machine": machine(),
        "smoke": args.smoke,
        "ops": n_ops,
        "configs": n_configs,
        "dedup_s": round(dedup_s, 4),
        "replay_per_config_ms": round(per_config_ms, 2),
        "timed_op_ms_per_config": round(op_ms, 3),
        "targets": {"dedup_s": TARGET_DEDUP_S, "replay_per_config_ms": TARGET_PER_CONFIG_MS},
    }
    name = "replay_smoke" if args.smoke else "replay"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    md = (
        f"# Replay overhead (CPU)\n\nMachine: {data['machine']} (2 cores shared with other jobs).\n\n"
        f"| what | measured | target |\n|---|---|---|\n"
        f"| unique_configs over {n_ops} ops ({n_configs} configs) | {dedup_s:.3f} s | < {TARGET_DEDUP_S} s |\n"
        f"| replay per small config (check + timing + JSONL) | {per_config_ms:.1f} ms | < {TARGET_PER_CONFIG_MS} ms |\n"
        f"\nCommand: `python benchmarks/bench_replay.py{' --smoke' if args.smoke else ''}`\n"
    )
    (RESULTS / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
