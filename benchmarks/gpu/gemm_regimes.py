"""Two GEMM questions the held-out misses raise (issue 18), measured on one GPU.

1. **Grouped GEMMs under natural routing.** torch's sm90 grouped GEMM (CUTLASS, tile 128 x 256 x 64 as
   its kernel name says) runs ``ceil(rows / 128)`` row tiles per expert. The device profile measures
   expert GEMMs with exactly balanced rows (512 per expert for 2048 tokens picking 2 of 8: four full
   tiles each); a router that picks experts at random gives each expert 512 +- ~20 rows, so about half
   the experts spill into a fifth tile. This times Mixtral's two expert GEMMs with balanced rows and with
   rows drawn by a uniform random router (several seeds).
2. **Burst against sustained.** The profile's points for the largest dense GEMMs ran at 1425-1500 MHz
   (power-capped); the same GEMMs in a two-layer model ran faster. This times three Llama-70B GEMMs
   after the device idled (one call, then idle again) and in a sustained loop, with the SM clock.

3. **After idle.** Dense GEMMs after 1 s of idle, the clock ramped first by 0, 10 or 30 ms of light
   work, against the same GEMMs sustained (``--only-after-idle`` runs this part alone).

    python3 benchmarks/gpu/gemm_regimes.py --out $OUT/gemm_regimes.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from heldout import sm_clock as heldout_sm_clock


def sm_clock() -> float | None:
    """The SM clock now, MHz (``heldout.sm_clock``'s reading)."""
    reading = heldout_sm_clock()
    return float(reading.split()[0]) if reading else None


def event_time_us(fn: Any, torch: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e3


def grouped(torch: Any, seeds: int) -> list[dict[str, Any]]:
    tokens, experts, top_k, hidden, inter = 2048, 8, 2, 4096, 14336
    rows = tokens * top_k
    gm = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    out = []
    for part, k, n in (("gate_up", hidden, 2 * inter), ("down", inter, hidden)):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)  # as transformers
        plans: list[tuple[str, list[int]]] = [("balanced", [rows // experts] * experts)]
        for s in range(seeds):
            g = torch.Generator(device="cpu").manual_seed(s)
            picks = torch.rand(tokens, experts, generator=g).topk(top_k, dim=-1).indices.flatten()
            plans.append((f"uniform router seed {s}", torch.bincount(picks, minlength=experts).tolist()))
        for name, counts in plans:
            offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
            call = functools.partial(gm, x, w, offs=offs)
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            times = [event_time_us(call, torch) for _ in range(15)]
            tiles = sum(-(-c // 128) for c in counts)
            out.append({"part": part, "routing": name, "counts": counts, "row_tiles": tiles,
                        "us_median": statistics.median(times), "us_min": min(times)})  # fmt: skip
            print(f"grouped {part:7s} {name:22s} tiles {tiles:3d} {statistics.median(times):8.1f} us", flush=True)
    return out


def dense(torch: Any) -> list[dict[str, Any]]:
    out = []
    for m, n, k in ((2048, 8192, 8192), (2048, 28672, 8192), (2048, 8192, 28672)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        mm = functools.partial(torch.matmul, a, b)
        for _ in range(3):
            mm()
        torch.cuda.synchronize()
        burst, clocks_idle = [], []
        for _ in range(8):
            time.sleep(0.25)
            clocks_idle.append(sm_clock())
            burst.append(event_time_us(mm, torch))
        t_end = time.perf_counter() + 2.0
        while time.perf_counter() < t_end:  # sustained: back to back for 2 s
            for _ in range(20):
                mm()
            torch.cuda.synchronize()
        clock_hot = sm_clock()
        sustained = [event_time_us(mm, torch) for _ in range(10)]
        flops = 2 * m * n * k
        b_us, s_us = statistics.median(burst), statistics.median(sustained)
        row = {"m": m, "n": n, "k": k, "burst_us": b_us, "sustained_us": s_us, "burst_tflops": flops / b_us / 1e6,
               "sustained_tflops": flops / s_us / 1e6, "sm_clock_idle": clocks_idle,
               "sm_clock_sustained": clock_hot}  # fmt: skip
        out.append(row)
        print(f"dense m{m} n{n} k{k}: burst {row['burst_us']:.1f} us, sustained {row['sustained_us']:.1f} us, "
              f"clock after sustained {clock_hot}", flush=True)  # fmt: skip
        time.sleep(1.0)
    return out


AFTER_IDLE_SHAPES = ((14336, 4096), (4096, 14336), (128256, 4096), (8192, 8192), (28672, 8192), (18944, 3584))
"""(n, k) of dense GEMMs of the sweep (Llama-8B, Llama-70B, Qwen2.5-7B) timed after idle."""


def after_idle(torch: Any, ramps_ms: tuple[float, ...] = (0.0, 10.0, 30.0)) -> list[dict[str, Any]]:
    """Dense GEMMs after 1 s of idle, the clock first ramped by ``ramp`` ms of light work (zeroing a
    256 MB buffer: memory-bound, little power), then 5 calls timed one by one; against the same calls
    after 1.5 s back to back (sustained)."""
    buf = torch.empty(128 << 20, device="cuda", dtype=torch.bfloat16)

    def light(ms: float) -> None:
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            buf.zero_()
            torch.cuda.synchronize()

    out = []
    for m in (2048, 4096):
        for n, k in AFTER_IDLE_SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
            mm = functools.partial(torch.matmul, a, b)
            mm()
            torch.cuda.synchronize()
            row: dict[str, Any] = {"m": m, "n": n, "k": k}
            for ramp in ramps_ms:
                time.sleep(1.0)
                light(ramp)
                row[f"after_idle_ramp{ramp:g}ms_us"] = statistics.median(event_time_us(mm, torch) for _ in range(5))
            t_end = time.perf_counter() + 1.5
            while time.perf_counter() < t_end:
                for _ in range(10):
                    mm()
                torch.cuda.synchronize()
            row["sustained_us"] = statistics.median(event_time_us(mm, torch) for _ in range(10))
            row["sm_clock_sustained"] = sm_clock()
            out.append(row)
            ratios = ", ".join(
                f"ramp {r:g} ms {row[f'after_idle_ramp{r:g}ms_us'] / row['sustained_us']:.3f}" for r in ramps_ms
            )
            print(f"after idle m{m} n{n} k{k}: sustained {row['sustained_us']:.1f} us; {ratios}", flush=True)
            del a, b
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--only-after-idle", action="store_true", help="only the GEMMs after idle (question 3)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("error: needs a CUDA device")
        return 2
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    if args.only_after_idle:
        result["after_idle"] = after_idle(torch)
    else:
        result |= {"grouped": grouped(torch, args.seeds), "dense": dense(torch), "after_idle": after_idle(torch)}
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
