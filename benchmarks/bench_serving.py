"""Served-workload speed: 1,000 requests of Llama-3.1-8B on an H100, continuous batching (target <= 30 s).

Captures the prefill and decode templates on meta, then serves a seeded Poisson workload (10
requests/s, prompts 128..2048 tokens, outputs 16..512 tokens; max batch 64, token budget 8192)
with step costs from op-graph simulations (the CLI's default cost model for the H100, its shipped
profile; eager host). Reports the wall
time of the capture and of the serving simulation (imports excluded, measured separately), the
process CPU time (the machine is shared: CPU time is the honest number under load), the step
shapes simulated and the headline latencies. Chunked prefill and static batching run too, for
reference (no target).

    python benchmarks/bench_serving.py            # full size
    python benchmarks/bench_serving.py --smoke    # a tiny model and 30 requests (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, TINY_LLAMA, machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S = 30.0
FULL = {"model": "llama-3.1-8b", "requests": 1000, "rate": 10.0, "prompt": "128..2048", "output": "16..512"}
TINY = {**TINY_LLAMA, "max_position_embeddings": 4096}
"""The tiny llama, with room for the smoke workload's prompts and outputs."""
SMOKE = {"model": "", "requests": 30, "rate": 50.0, "prompt": "16..256", "output": "4..64"}


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(setup: dict[str, Any], schedulers: list[str]) -> dict[str, Any]:
    t_import = time.perf_counter()
    import transformers  # noqa: F401  (imports are timed apart: torch and transformers take seconds)

    import opgraph.capture  # noqa: F401
    from hardware import default_cost_model, load_hardware
    from opgraph.scenario.serving import capture_serving_model, simulate_serving
    from opgraph.study import study_config
    from simulators.serving import LengthDist, poisson_workload

    import_s = time.perf_counter() - t_import
    cpu0, t0 = _cpu_s(), time.perf_counter()
    templates = capture_serving_model(setup["model"])
    capture_s, capture_cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    reqs = poisson_workload(
        rate=setup["rate"],
        num_requests=setup["requests"],
        prompt_len=LengthDist.parse(setup["prompt"]),
        output_len=LengthDist.parse(setup["output"]),
        seed=0,
    )
    hw = load_hardware("h100")
    cm, _ = default_cost_model(hw)  # as `opgraph serve-sim -H h100` without -c
    rows = []
    for name in schedulers:
        cpu1, t1 = _cpu_s(), time.perf_counter()
        res = simulate_serving(
            templates,
            reqs,
            hardware=hw,
            cost_model=cm,
            config=study_config(),
            scheduler=name,
            max_batch=64,
            token_budget=8192,
        )
        sim_s, sim_cpu = time.perf_counter() - t1, _cpu_s() - cpu1
        s = res.summary
        rows.append(
            {
                "scheduler": name,
                "simulate_s": round(sim_s, 2),
                "simulate_cpu_s": round(sim_cpu, 2),
                "capture_plus_simulate_s": round(capture_s + sim_s, 2),
                "steps": s.steps,
                "step_shapes": s.step_shapes_simulated,
                "completed": s.completed,
                "dropped": s.dropped,
                "ttft_p50_ms": round(s.ttft_ms.p50, 1),
                "ttft_p99_ms": round(s.ttft_ms.p99, 1),
                "tpot_p50_ms": round(s.tpot_ms.p50, 2),
                "tpot_p99_ms": round(s.tpot_ms.p99, 2),
                "e2e_p99_ms": round(s.e2e_ms.p99, 1),
                "output_tokens_per_s": round(s.output_tokens_per_s, 1),
                "notes": list(res.notes),
            }
        )
    return {
        "cost_model": type(cm).__name__,
        "import_s": round(import_s, 2),
        "capture_s": round(capture_s, 2),
        "capture_cpu_s": round(capture_cpu, 2),
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    setup = dict(SMOKE if args.smoke else FULL)
    if args.smoke:
        folder = Path(tempfile.mkdtemp(prefix="bench-serving-"))
        (folder / "config.json").write_text(json.dumps(TINY))
        setup["model"] = str(folder / "config.json")
    out = run(setup, ["continuous"] if args.smoke else ["continuous", "chunked", "static"])
    out.update(setup=setup, machine=machine(), cores=os.cpu_count(), load_average=os.getloadavg(), target_s=TARGET_S)
    cont = out["rows"][0]
    out["target_met"] = cont["capture_plus_simulate_s"] <= TARGET_S
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        "# Serving benchmark",
        "",
        f"Machine: {out['machine']} ({out['cores']} cores, shared). {setup['model']}, H100, "
        f"{out['cost_model']} (the CLI default), "
        f"{setup['requests']} Poisson requests at {setup['rate']}/s "
        f"(prompts {setup['prompt']}, outputs {setup['output']}), "
        "max batch 64, token budget 8192. Capture of the two templates: "
        f"{out['capture_s']} s wall ({out['capture_cpu_s']} s CPU); imports {out['import_s']} s (not counted).",
        "",
        "| scheduler | capture + simulate (s, <= 30 for continuous) | simulate wall (s) | simulate CPU (s) | steps "
        "| step shapes | TTFT p50/p99 (ms) | TPOT p50/p99 (ms) | e2e p99 (ms) | output tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['scheduler']} | {r['capture_plus_simulate_s']} | {r['simulate_s']} | {r['simulate_cpu_s']} "
            f"| {r['steps']} | "
            f"{r['step_shapes']} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['tpot_p50_ms']} / {r['tpot_p99_ms']} | "
            f"{r['e2e_p99_ms']} | {r['output_tokens_per_s']} |"
        )
    la = " ".join(f"{x:.2f}" for x in out["load_average"])
    lines += ["", f"Load average at the end of the run: {la} (other work shared the 2 cores)."]
    (RESULTS / "serving.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
