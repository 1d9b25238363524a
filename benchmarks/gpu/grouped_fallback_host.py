"""Host time of torch's ``_grouped_mm`` fallback (fp16: one ``mm`` per expert from C++) against a Python-level
``mm``, unprofiled, on a CUDA device.

For each shape and expert load it times, with ``time.perf_counter`` around the call alone:

- ``idle``: the device idle before the call (synchronised): the call's own host time (offsets copy, its sync
  on an empty queue, the per-expert loop);
- ``busy``: a ``busy_us`` GEMM queued just before: the call waits for it at the offsets copy;
- ``mm``: one Python-level ``torch.mm`` of the same per-expert shape (what a profile's GEMM point issues).

A line fit of the idle time over the experts that received rows (``a + b * active``) splits the call's fixed
host time from its per-expert time: ``fits`` here per row count, and ``python -m hardware.hostfit --fallback``
over the row counts' medians for the host profile (:func:`hardware.hostfit.fit_fallback_loops`). Writes one
JSON file.

    python3 benchmarks/gpu/grouped_fallback_host.py -o out/grouped_fallback_host.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hardware.hostfit import line_fit  # noqa: E402

SHAPES = (
    # name, experts, k, n (mat_b [E, k, n] as transformers passes its transposed weights)
    ("mixtral_gate_up", 8, 4096, 28672),
    ("mixtral_down", 8, 14336, 4096),
    ("qwen3moe_gate_up", 128, 2048, 1536),
    ("qwen3moe_down", 128, 768, 2048),
)


def loads(experts: int, active: int, rows: int) -> list[int]:
    """Rows per expert: ``active`` experts spread evenly over the ``experts``, ``rows`` each, the rest idle."""
    step = experts / active
    hit = {int(i * step) for i in range(active)}
    return [rows if e in hit else 0 for e in range(experts)]


def median_us(fn: Any, reps: int, before: Any) -> float:
    import torch

    times = []
    for _ in range(reps):
        before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--busy-us", type=float, default=1000.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.float16
    # a GEMM of about busy_us on this device, to queue before a call
    big = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        big @ big
    torch.cuda.synchronize()
    gemm_us = 1e6 * (time.perf_counter() - t0) / 5
    repeat = max(1, round(args.busy_us / gemm_us))

    def idle() -> None:
        torch.cuda.synchronize()

    def busy() -> None:
        torch.cuda.synchronize()
        for _ in range(repeat):
            big @ big

    rows_out: list[dict[str, Any]] = []
    for name, experts, k, n in SHAPES:
        w = torch.randn(experts, n, k, device=dev, dtype=dt) * 0.02
        mat_b = w.transpose(-2, -1)
        actives = sorted({experts, max(1, experts // 2), max(1, experts // 8), 1}, reverse=True)
        for rows in (1, 4, 32, 128):
            for active in actives:
                counts = loads(experts, active, rows)
                total = sum(counts)
                a = torch.randn(total, k, device=dev, dtype=dt)
                offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

                def call(a: Any = a, mat_b: Any = mat_b, offs: Any = offs) -> None:
                    torch._grouped_mm(a, mat_b, offs=offs)

                call()
                torch.cuda.synchronize()
                rec = {
                    "shape": name, "experts": experts, "k": k, "n": n, "rows": rows, "active": active,
                    "idle_us": median_us(call, args.reps, idle),
                    "busy_us": median_us(call, args.reps, busy),
                }  # fmt: skip
                rows_out.append(rec)
                print(json.dumps(rec), flush=True)
        x = torch.randn(4, k, device=dev, dtype=dt)
        wt = w[0].t()

        def mm(x: Any = x, wt: Any = wt) -> None:
            torch.mm(x, wt)

        mm()
        rows_out.append({"shape": name, "mm_us": median_us(mm, args.reps, idle)})
        print(json.dumps(rows_out[-1]), flush=True)
    fits = {}
    for name, _experts, _k, _n in SHAPES:
        for rows in (1, 4, 32, 128):
            pts = [(r["active"], r["idle_us"]) for r in rows_out if r.get("shape") == name and r.get("rows") == rows]
            if len(pts) >= 2:
                xs, ys = zip(*pts, strict=True)
                fixed, per_expert = line_fit(xs, ys)
                fits[f"{name}_r{rows}"] = {"fixed_us": fixed, "per_expert_us": per_expert}
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gemm_us": gemm_us,
        "busy_gemms": repeat,
        "reps": args.reps,
        "rows": rows_out,
        "fits": fits,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1))
    print(json.dumps(fits, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
