"""Capture speed and memory: Llama-3.1-70B prefill (batch 1, 2048 tokens) on meta, and friends.

For each model, in one process: the bare cost (build the model on meta from its config and run one
plain forward, no recording) and the capture (build + record + lower), each the best of ``--repeat``
runs; the ratio capture/bare is the target (<= 1.5). Then the whole ``opgraph capture`` command in a
fresh process: wall time (<= 10 s) and peak RSS (<= 1.5 GB), imports included.

    python benchmarks/bench_capture.py            # full: 70B, 405B, Qwen3-30B-A3B
    python benchmarks/bench_capture.py --smoke    # tiny, a few seconds (CI)
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, write_results

FULL = [("llama-3.1-70b", None), ("llama-3.1-405b", None), ("qwen3-30b-a3b", None)]
SMOKE = [("llama-3.2-1b", 2)]
SEQ_LEN = 2048  # tokens
TARGET_RATIO = 1.5
TARGET_WALL_S = 10.0
TARGET_RSS_MB = 1536.0


def bare(model: str, layers: int | None, seq_len: int) -> float:
    """Seconds to build on meta and run one plain forward."""
    import gc

    import torch
    import transformers

    from opgraph.capture.sources import build_config, resolve

    cfg = build_config(resolve(model), layers=layers)
    gc.collect()
    t0 = time.perf_counter()
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")  # type: ignore[no-untyped-call]
    with torch.no_grad():
        m(input_ids=torch.zeros(1, seq_len, dtype=torch.long, device="meta"))
    return time.perf_counter() - t0


def captured(model: str, layers: int | None, seq_len: int) -> tuple[float, int]:
    """Seconds to capture (build + record + lower) and the op count."""
    import gc

    from opgraph.capture import capture

    gc.collect()
    t0 = time.perf_counter()
    g = capture(model, seq_len=seq_len, layers=layers)
    return time.perf_counter() - t0, len(g.ops)


def command(model: str, layers: int | None, seq_len: int) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MB) and CPU seconds of `opgraph capture` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            sys.executable,
            "-m",
            "opgraph",
            "capture",
            model,
            "--seq-len",
            str(seq_len),
            "-o",
            str(Path(tmp) / "g.json.gz"),
        ]
        if layers:
            args += ["--layers", str(layers)]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = r0.ru_maxrss
        t0 = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return wall, max(r1.ru_maxrss, before) / 1024, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few seconds")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (best is kept)")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/capture.*")
    args = ap.parse_args()
    models = SMOKE if args.smoke else FULL
    seq_len = 64 if args.smoke else SEQ_LEN
    repeat = 1 if args.smoke else args.repeat
    rows: list[dict[str, Any]] = []
    from opgraph.capture import capture

    capture(models[0][0], seq_len=8, layers=1)  # warm imports and lazy modules once
    for model, layers in models:
        b = min(bare(model, layers, seq_len) for _ in range(repeat))
        caps = [captured(model, layers, seq_len) for _ in range(repeat)]
        c, n_ops = min(caps)
        wall, rss, cpu_s = command(model, layers, seq_len)
        row = {
            "model": model,
            "seq_len": seq_len,
            "layers": layers,
            "ops": n_ops,
            "bare_s": round(b, 3),
            "capture_s": round(c, 3),
            "ratio": round(c / b, 3),
            "command_wall_s": round(wall, 2),
            "command_cpu_s": round(cpu_s, 2),
            "command_peak_rss_mb": round(rss, 1),
        }
        rows.append(row)
        print(
            f"{model:16s} ops={n_ops:6d} bare={b:.2f}s capture={c:.2f}s ratio={c / b:.2f} "
            f"(target <= {TARGET_RATIO})  command={wall:.1f}s (cpu {cpu_s:.1f}s) rss={rss:.0f}MB"
        )
    if not args.smoke and not args.no_write:
        lines = [
            f"# Capture benchmark\n\nMachine: {machine()} (2 cores, shared). Prefill, batch 1, {seq_len} tokens, "
            f"meta device, bf16. Best of {repeat} in one process; the command in a fresh process.\n",
            "| model | ops | bare build+forward (s) | capture (s) | ratio (<= 1.5) | `opgraph capture` wall (s, <= 10) "
            "| command CPU (s) | peak RSS (MB, <= 1536) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['model']} | {r['ops']} | {r['bare_s']} | {r['capture_s']} | {r['ratio']} | "
                f"{r['command_wall_s']} | {r['command_cpu_s']} | {r['command_peak_rss_mb']} |"
            )
        write_results(
            "capture",
            rows,
            lines,
            "other work shared the 2 cores; wall times are inflated by it, the CPU column is the command's own "
            "user+sys time",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
