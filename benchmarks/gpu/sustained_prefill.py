"""Prefills' GPU time after idle and over a sustained run (issue 18: the Llama-70B prefill's GPU-time miss).

The held-out protocol times 9 forwards after two warm-ups; in each of its passes the Llama-70B prefill's
GPU time rose from about 16.9 ms (first runs) to 18.2-18.9 ms (last runs) as its GEMMs drove the device
into its power cap. This runs each case's forward back to back for ``--seconds`` after ``--idle-s`` of
idle and records, per forward, the device time between CUDA events around it, the SM clock and the
board power (NVML), so the transient and the sustained state are both on record. Then, with the device
still in its sustained state, ``--profiled`` more forwards run under ``torch.profiler`` as the held-out
protocol profiles them: their GPU time (the sum of device activity durations, the table's definition).
``--burst N`` profiles N forwards right after the idle as well: the state a short forward after idle meets.

    python3 benchmarks/gpu/sustained_prefill.py --out $OUT/sustained.json [--cases A,B --burst 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import heldout


def _nvml() -> Any:
    """An NVML reader of (SM clock MHz, power W) for device 0, or ``None`` without ``pynvml``."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None

    def read() -> tuple[int, float]:
        clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        return clock, pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3

    return read


def _profiled(phase: Any, n: int, read: Any) -> dict[str, Any]:
    """GPU time (sum of device activity durations) of ``n`` forwards profiled back to back, as
    ``heldout.measure`` profiles its runs, and the SM clock after them."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            cache = phase.fresh()
            torch.cuda.synchronize()
            with record_function(f"{heldout.RUN_RANGE}{i}"):
                phase.run(cache)
                torch.cuda.synchronize()
    clock = read()[0] if read is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        runs = heldout.split_runs(json.loads(path.read_text()))
    gpu = [r["gpu_us"] for r in runs]
    return {"runs": n, "gpu_us": heldout.stats(gpu), "sm_mhz_after": clock}


def measure_case(case: dict[str, Any], args: argparse.Namespace, read: Any) -> dict[str, Any]:
    """One case: built as ``heldout.py`` builds it, idle, ``--burst`` forwards profiled (the device's state
    after idle), then forwards back to back for ``--seconds`` timed with CUDA events, then ``--profiled``
    forwards profiled in the sustained state."""
    import torch

    model, config = heldout.build_model(heldout.case_config(case, False), case["dtype"], "cuda")
    phase = heldout.Phase(model, config, case, "cuda")
    for _ in range(2):
        phase.run(phase.fresh())
    torch.cuda.synchronize()
    time.sleep(args.idle_s)
    burst = _profiled(phase, args.burst, read) if args.burst else None
    runs: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        cache = phase.fresh()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        phase.run(cache)
        end.record()
        end.synchronize()
        row = {"t_s": round(time.perf_counter() - t0, 4), "device_us": round(start.elapsed_time(end) * 1e3, 1)}
        if read is not None:
            clock, watts = read()
            row.update(sm_mhz=clock, power_w=round(watts, 1))
        runs.append(row)
    gpu = _profiled(phase, args.profiled, read)
    del phase, model
    torch.cuda.empty_cache()
    us = [r["device_us"] for r in runs]
    windows = [runs[i : i + 9] for i in range(0, len(runs), max(1, len(runs) // 10))]
    return {
        "case": case["case"],
        "idle_s": args.idle_s,
        "runs": runs,
        "first_9_median_us": statistics.median(us[:9]),
        "last_9_median_us": statistics.median(us[-9:]),
        "burst_profiled": burst,
        "sustained_profiled": gpu,
        "windows": [
            {
                "from_s": w[0]["t_s"],
                "median_us": statistics.median(r["device_us"] for r in w),
                **({"median_mhz": statistics.median(r["sm_mhz"] for r in w)} if "sm_mhz" in w[0] else {}),
            }
            for w in windows
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--cases",
        default="llama70b_prefill_b1_s2048_bf16_l2",
        help="comma-separated cases of heldout.py (CASES or TRAIN_WALL_CASES)",
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--burst", type=int, default=0, help="forwards profiled right after the idle")
    ap.add_argument("--profiled", type=int, default=9)
    args = ap.parse_args()
    import torch

    known = {c["case"]: c for c in [*heldout.CASES, *heldout.TRAIN_WALL_CASES]}
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in known]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)} (--cases)")
    read = _nvml()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "definition": "device_us: CUDA events recorded just before and after one forward (the device's span "
        "of the forward, gaps included), forwards back to back with a fresh cache and a synchronize between; "
        "*_profiled: GPU time (sum of device activity durations) as heldout.py profiles its runs",
        "cases": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        row = measure_case(known[name], args, read)
        result["cases"].append(row)
        args.out.write_text(json.dumps(result, indent=1))  # rewritten after each case
        print(json.dumps({k: v for k, v in row.items() if k not in ("runs", "windows")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
