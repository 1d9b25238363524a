"""Measure HF ``generate`` on a GPU: total time and per-forward (per-step) times (issue 20's validation).

For each case: the model built from a preset config (random bf16 weights, SDPA, cut to a few layers),
warmed up, then ``generate`` with ``min_new_tokens = max_new_tokens = N`` (greedy) timed end to end
(CUDA-synchronised wall, median of ``--runs``), and each forward pass of one more run timed with CUDA
events recorded by forward pre/post hooks (device-side time from the first kernel issued after the
pre-hook to the last before the post-hook, no synchronisation inside the loop). The CPU side
(``benchmarks/generate_validate_report.py``) captures the same generation on meta and compares.

    python3 benchmarks/gpu/generate_validate.py --out "$OUT/generate_validate.json"
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_traces import Case, build_config

CASES = [
    # (name, preset, layers, batch, prompt tokens, new tokens)
    ("llama1b_b1_p128_n32", "llama-3.2-1b", 4, 1, 128, 32),
    ("llama8b_b8_p512_n32", "llama-3.1-8b", 2, 8, 512, 32),
    ("qwen25_7b_b4_p256_n24", "qwen2.5-7b", 2, 4, 256, 24),
]


def measure(name: str, preset: str, layers: int, batch: int, prompt: int, new: int, runs: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = build_config(Case(name, preset, layers, "generate", batch=batch, seq_len=prompt, new_tokens=new))
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    vocab = int(getattr(config, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda")
    kwargs = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False}

    def run() -> None:
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)

    for _ in range(2):
        run()
    torch.cuda.synchronize()
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    events: list[tuple[Any, Any]] = []
    starts: list[float] = []
    ends: list[float] = []

    def pre(*_: Any) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        events.append((e, None))
        starts.append(time.perf_counter())

    def post(*_: Any) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        events[-1] = (events[-1][0], e)
        ends.append(time.perf_counter())

    h1, h2 = model.register_forward_pre_hook(pre), model.register_forward_hook(post)
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    total_hooked = (time.perf_counter() - t0) * 1e6
    h1.remove()
    h2.remove()
    device_us = [a.elapsed_time(b) * 1e3 for a, b in events]
    # Wall per forward: from one forward's start to the next one's (the last: to its end).
    host_us = [(starts[i + 1] - starts[i]) * 1e6 for i in range(len(starts) - 1)] + [(ends[-1] - starts[-1]) * 1e6]
    torch.cuda.empty_cache()
    return {
        "case": name,
        "preset": preset,
        "layers": layers,
        "batch": batch,
        "prompt": prompt,
        "new_tokens": new,
        "forwards": len(events),
        "wall_us": {"median": statistics.median(walls), "runs": walls},
        "hooked_wall_us": total_hooked,
        "step_device_us": device_us,
        "step_wall_us": host_us,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    import torch
    import transformers

    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cases": [],
    }
    for case in CASES:
        try:
            out["cases"].append(measure(*case, runs=args.runs))
            print(case[0], "ok", flush=True)
        except Exception as exc:  # one failing case must not stop the others
            out["cases"].append({"case": case[0], "error": f"{type(exc).__name__}: {exc}"})
            print(case[0], "error", exc, flush=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
