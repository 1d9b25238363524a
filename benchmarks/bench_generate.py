"""Generate-phase capture speed and memory: a planned generation (prefill + decode steps 1-2 recorded,
the rest built from step 2, :mod:`opgraph.capture.generation`) against recording every step.

Each row runs in a fresh process what ``opgraph capture MODEL --phase generate`` does: capture, save
the graph (``.json.gz``), summarise it and list its ``other`` ops, imports included; it reports wall
time, the process's own CPU time (user+sys) and its peak RSS (``ru_maxrss``). ``planned`` is the
default capture; ``recorded`` records and lowers every decode step (the capture before plans).
Target: Llama-3.1-70B, 2048-token prompt, 1,024 new tokens, planned, in at most 10 s and 1.5 GB.

    python benchmarks/bench_generate.py            # full (several minutes on 2 shared cores)
    python benchmarks/bench_generate.py --smoke    # tiny, a few seconds (CI)
    python benchmarks/bench_generate.py --only simulate

Simulation rows: the planned graph simulated by :func:`simulators.simulate_generation` (target: a
1,024-step generation in at most 5 s), against :func:`simulators.simulate` of the expanded graph
where that is affordable (the makespans must agree within 0.1%).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, write_results

# (model, layers, seq_len, new_tokens, mode)
FULL: list[tuple[str, int | None, int, int, str]] = [
    ("llama-3.1-8b", None, 512, 8, "recorded"),
    ("llama-3.1-8b", None, 512, 8, "planned"),
    ("llama-3.1-8b", None, 512, 128, "recorded"),
    ("llama-3.1-8b", None, 512, 128, "planned"),
    ("llama-3.1-70b", None, 2048, 8, "planned"),
    ("llama-3.1-70b", None, 2048, 128, "planned"),
    ("llama-3.1-70b", None, 2048, 1024, "planned"),
]
SMOKE: list[tuple[str, int | None, int, int, str]] = [
    ("llama-3.2-1b", 2, 32, 8, "recorded"),
    ("llama-3.2-1b", 2, 32, 64, "planned"),
]
TARGET_WALL_S = 10.0
TARGET_RSS_MB = 1536.0
# Simulation rows: (model, layers, seq_len, new_tokens, also simulate op by op)
SIM_FULL: list[tuple[str, int | None, int, int, bool]] = [
    ("llama-3.1-8b", None, 512, 128, True),
    ("llama-3.1-70b", None, 2048, 1024, False),
]
SIM_SMOKE: list[tuple[str, int | None, int, int, bool]] = [("llama-3.2-1b", 2, 32, 24, True)]
TARGET_SIM_S = 5.0


def sim_child(model: str, layers: int | None, seq_len: int, new_tokens: int, full: bool) -> None:
    """Capture (untimed), then simulate the planned generation from windows (and op by op); one JSON line."""
    from hardware import load_hardware, resolve_cost_model
    from opgraph.capture.api import capture
    from opgraph.study import study_config
    from simulators import simulate, simulate_generation

    g = capture(model, phase="generate", seq_len=seq_len, new_tokens=new_tokens, layers=layers)
    hw, cm, cfg = load_hardware("h100"), resolve_cost_model("roofline"), study_config()
    t0, c0 = time.perf_counter(), time.process_time()
    fast = simulate_generation(g, hw, cm, cfg)
    t1, c1 = time.perf_counter(), time.process_time()
    row: dict[str, Any] = {
        "ops": len(g.ops),
        "windows": len(fast.windows),
        "makespan_us": round(fast.makespan_us, 3),
        "sim_s": round(t1 - t0, 2),
        "sim_cpu_s": round(c1 - c0, 2),
    }
    if full:
        expanded = g.expand()
        t2, c2 = time.perf_counter(), time.process_time()
        ref = simulate(expanded, hw, cm, cfg)
        row["full_sim_s"] = round(time.perf_counter() - t2, 2)
        row["full_sim_cpu_s"] = round(time.process_time() - c2, 2)
        row["full_makespan_us"] = round(ref.makespan_us, 3)
        row["rel_error"] = (fast.makespan_us - ref.makespan_us) / ref.makespan_us
    ru = resource.getrusage(resource.RUSAGE_SELF)
    row["peak_rss_mb"] = round(ru.ru_maxrss / 1024, 1)
    print(json.dumps(row))


def child(model: str, layers: int | None, seq_len: int, new_tokens: int, mode: str) -> None:
    """What ``opgraph capture`` does, timed from the start of the process; prints one JSON line."""
    start = time.perf_counter()
    from opgraph.capture.api import CaptureOptions, capture, record
    from opgraph.ir import OpKind
    from opgraph.ir.io import save_graph

    t_import = time.perf_counter()
    if mode == "planned":
        g = capture(model, phase="generate", seq_len=seq_len, new_tokens=new_tokens, layers=layers)
    else:
        opts = CaptureOptions(phase="generate", seq_len=seq_len, new_tokens=new_tokens, layers=layers)
        g = record(model, opts).graph
    t_capture = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = save_graph(g, Path(tmp) / "g.json.gz")
        size = path.stat().st_size
    summary = g.summary()
    others = len(g.ops_of(OpKind.OTHER))
    end = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "ops": summary["ops"],
                "edges": summary["edges"],
                "planned": g.generation is not None,
                "others": others,
                "file_kb": round(size / 1024, 1),
                "import_s": round(t_import - start, 2),
                "capture_s": round(t_capture - t_import, 2),
                "save_summary_s": round(end - t_capture, 2),
                "wall_s": round(end - start, 2),
                "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
                "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
            }
        )
    )


def run_row(model: str, layers: int | None, seq_len: int, new_tokens: int, mode: str) -> dict[str, Any]:
    """One row, in a fresh process."""
    args = [sys.executable, __file__, "--child", model, str(layers or 0), str(seq_len), str(new_tokens), mode]
    t0 = time.perf_counter()
    proc = subprocess.run(args, check=True, capture_output=True, text=True)
    outer = time.perf_counter() - t0
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update(model=model, layers=layers, seq_len=seq_len, new_tokens=new_tokens, mode=mode)
    row["process_wall_s"] = round(outer, 2)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few seconds")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/generate.*")
    ap.add_argument("--only", choices=("capture", "simulate"), help="run one half")
    ap.add_argument("--child", nargs=5, metavar=("MODEL", "LAYERS", "SEQ", "N", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, layers, seq, n, mode = args.child
        if mode in ("sim", "sim+full"):
            sim_child(model, int(layers) or None, int(seq), int(n), mode == "sim+full")
        else:
            child(model, int(layers) or None, int(seq), int(n), mode)
        return 0
    if args.only != "capture":
        sim_rows = []
        for model, layers, seq, n, full in SIM_SMOKE if args.smoke else SIM_FULL:
            cmd = [sys.executable, __file__, "--child", model, str(layers or 0), str(seq), str(n)]
            proc = subprocess.run([*cmd, "sim+full" if full else "sim"], check=True, capture_output=True, text=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row.update(model=model, seq_len=seq, new_tokens=n)
            sim_rows.append(row)
            print(f"simulate {model} seq={seq} N={n}: {row}", flush=True)
        if not args.smoke and not args.no_write:
            write_sim(sim_rows)
    if args.only == "simulate":
        return 0
    rows = []
    for spec in SMOKE if args.smoke else FULL:
        row = run_row(*spec)
        rows.append(row)
        print(
            f"{row['model']:14s} seq={row['seq_len']:5d} N={row['new_tokens']:5d} {row['mode']:9s} ops={row['ops']:8d} "
            f"wall={row['process_wall_s']:.1f}s cpu={row['cpu_s']:.1f}s rss={row['peak_rss_mb']:.0f}MB "
            f"(capture {row['capture_s']:.1f}s, save+summary {row['save_summary_s']:.1f}s)",
            flush=True,
        )
    if not args.smoke and not args.no_write:
        lines = [
            f"# Generate capture benchmark\n\nMachine: {machine()} (2 cores, shared by other work). Batch 1, meta "
            "device, bf16. Each row is a fresh process doing what `opgraph capture --phase generate` does "
            "(capture, save as .json.gz, summary, list of `other` ops), imports included. `planned`: prefill and "
            "decode steps 1-2 recorded, later steps built from step 2 and checked against a recording of the "
            "last step; `recorded`: every step recorded and lowered.\n",
            f"| model | prompt | new tokens | mode | ops | wall (s, <= {TARGET_WALL_S:g}) | CPU (s) "
            f"| peak RSS (MB, <= {TARGET_RSS_MB:g}) | capture (s) | save+summary (s) | file (KB) |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['model']} | {r['seq_len']} | {r['new_tokens']} | {r['mode']} | {r['ops']} | "
                f"{r['process_wall_s']} | {r['cpu_s']} | {r['peak_rss_mb']} | {r['capture_s']} | "
                f"{r['save_summary_s']} | {r['file_kb']} |"
            )
        note = "wall times are inflated by other work on the 2 cores; the CPU column is the process's own user+sys time"
        write_results("generate", rows, lines, note)
    return 0


def write_sim(rows: list[dict[str, Any]]) -> None:
    """benchmarks/results/generate_sim.{json,md}."""
    lines = [
        f"# Generation simulation benchmark\n\nMachine: {machine()} (2 cores, shared by other work). H100 SXM, "
        "roofline, "
        "`opgraph simulate` defaults (eager host, one compute engine). `windows`: `simulators.simulate_generation` "
        "(recorded part + a few two-step windows, other steps interpolated); `op by op`: `simulators.simulate` "
        "of the expanded graph.\n",
        f"| model | prompt | new tokens | ops | windows | windows sim wall (s, <= {TARGET_SIM_S:g}) | CPU (s) "
        "| op-by-op sim wall (s) | CPU (s) | makespan (ms) | op-by-op makespan (ms) | relative error | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        full_ms = f"{r['full_makespan_us'] / 1e3:.3f}" if "full_makespan_us" in r else "-"
        err = f"{r['rel_error']:.1e}" if "rel_error" in r else "-"
        lines.append(
            f"| {r['model']} | {r['seq_len']} | {r['new_tokens']} | {r['ops']} | {r['windows']} | {r['sim_s']} | "
            f"{r['sim_cpu_s']} | {r.get('full_sim_s', '-')} | {r.get('full_sim_cpu_s', '-')} | "
            f"{r['makespan_us'] / 1e3:.3f} | {full_ms} | {err} | {r['peak_rss_mb']} |"
        )
    note = "wall times are inflated by other work on the 2 cores; the CPU columns are the simulation's own process time"
    write_results("generate_sim", rows, lines, note)


if __name__ == "__main__":
    raise SystemExit(main())
