"""How a GPU's heavy kernels depend on its thermal and power state (the sweep's state versus a model run's).

Run from the repo root on the GPU machine: ``source benchmarks/gpu/env.sh; $PY benchmarks/gpu/thermal_probe.py
hardware/catalog/h100-sxm.profile.json --out $OUT/thermal.jsonl --min-us 500`` (about 5 minutes). Three
measurements, one JSON line each in the ``--out`` file:

1. ``transient``: after ``--idle-s`` idle seconds, one heavy GEMM back to back for ``--soak-s`` seconds,
   each call timed by CUDA events, with the SM clock, power and temperature sampled along the way:
   how fast, and on what time scale, the GPU slows from idle to sustained load.
2. ``hot``: the shipped profile's heavy points replayed back to back right after that soak, with the
   sweep's own timer and options (:func:`validators.profile.sweep_timing`): the state a sweep is in.
3. ``cool``: the same points, each after ``--cool-s`` idle seconds: the state of a single forward
   pass profiled with gaps between runs.

Points: every profile point of ``--min-us`` or more (default 300 us) whose kind is in ``--kinds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _nvml(index: int) -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def _state(nv: Any) -> dict[str, float]:
    if nv is None:
        return {}
    m, h = nv
    return {
        "sm_mhz": float(m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM)),
        "power_w": m.nvmlDeviceGetPowerUsage(h) / 1e3,
        "temp_c": float(m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU)),
    }


def transient(torch: Any, nv: Any, m: int, n: int, k: int, soak_s: float) -> dict[str, Any]:
    """Per-call times of one GEMM run back to back for ``soak_s`` seconds from where the GPU is now."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    events = []
    states = []
    start = time.perf_counter()
    while time.perf_counter() - start < soak_s:
        batch = []
        for _ in range(16):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.mm(a, w.t())
            e.record()
            batch.append((s, e))
        batch[-1][1].synchronize()
        events.extend(batch)
        states.append({"t_s": time.perf_counter() - start, **_state(nv)})
    us = [s.elapsed_time(e) * 1e3 for s, e in events]
    return {"what": "transient", "m": m, "n": n, "k": k, "call_us": us, "states": states}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-us", type=float, default=300.0)
    ap.add_argument("--kinds", default="gemm,attention,moe_routing,activation,norm,memory,rope")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--soak-s", type=float, default=4.0)
    ap.add_argument("--cool-s", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=0, help="at most this many points (0: all)")
    args = ap.parse_args()

    import torch

    from hardware import load_profile
    from validators.configs import OpConfig
    from validators.profile import sweep_options, sweep_timing
    from validators.replay import Replayer

    prof = load_profile(args.profile)
    kinds = set(args.kinds.split(","))
    pts = [p for p in prof.points if p.seconds * 1e6 >= args.min_us and p.op.kind.value in kinds]
    pts.sort(key=lambda p: (p.op.kind.value, p.op.definition, p.seconds))
    if args.limit:
        pts = pts[: args.limit]
    nv = _nvml(0)
    rep = Replayer("cuda", sweep_options(sweep_timing("cuda")))
    out = args.out.open("w", encoding="utf-8")

    def write(rec: dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def replay(p: Any) -> dict[str, Any]:
        before = _state(nv)
        r = rep.replay(OpConfig(key=p.key, op=p.op, count=1, op_ids=[0]))
        t = r.timing
        return {
            "key": p.key, "kind": p.op.kind.value, "definition": p.op.definition, "flops": p.op.flops,
            "bytes": p.op.bytes_read + p.op.bytes_written, "profile_us": p.seconds * 1e6,
            "profile_clock": p.sm_clock_mhz, "us": t.median_us if t else None, "iqr_us": t.iqr_us if t else None,
            "clock": t.sm_clock_mhz if t else None, "before": before, "after": _state(nv),
            "m": getattr(p.op, "m", None),
        }  # fmt: skip

    try:
        write({"what": "header", "device": torch.cuda.get_device_name(), "points": len(pts), "args": vars(args) | {
            "profile": str(args.profile), "out": str(args.out)}, "state": _state(nv)})  # fmt: skip
        print(f"{len(pts)} points", flush=True)
        time.sleep(args.idle_s)
        t0 = time.perf_counter()
        write(transient(torch, nv, 2048, 28672, 8192, args.soak_s))
        print(f"transient done {time.perf_counter() - t0:.1f}s", flush=True)
        t0 = time.perf_counter()
        for p in pts:
            write({"what": "hot", **replay(p)})
        print(f"hot pass {time.perf_counter() - t0:.1f}s", flush=True)
        t0 = time.perf_counter()
        for p in reversed(pts):
            time.sleep(args.cool_s)
            write({"what": "cool", **replay(p)})
        print(f"cool pass {time.perf_counter() - t0:.1f}s", flush=True)
    finally:
        rep.close()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
