"""Does a softmax's time depend on its data? ``softmax(x, dtype=float32)`` of half scores as eager attention's
prefill has them (causally masked: ``finfo.min`` or ``-inf`` past the diagonal) against random normal scores
(what the profile sweep measured), and a float32 softmax of the masked scores.

Run on the GPU machine: ``python3 benchmarks/gpu/softmax_data_probe.py OUT.json``. Prints and writes the median
of 20 CUDA-event-timed calls (after 3 warm-up calls) per case, in microseconds. Committed result:
``benchmarks/results/gpu/h100/softmax-data/softmax_data_probe.json`` (NVIDIA H100 80GB HBM3).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def median_us(fn: Callable[[], Any], calls: int = 20) -> float:
    """Median CUDA-event time of ``fn`` in microseconds."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def probe(b: int, h: int, q: int) -> dict[str, float]:
    """The cases for scores ``[b, h, q, q]``."""
    import torch

    x = torch.randn(b, h, q, q, device="cuda", dtype=torch.float16)
    keep = torch.ones(q, q, device="cuda", dtype=torch.bool).tril()
    low = torch.finfo(torch.float16).min
    cases = {
        "randn": x,
        "causal finfo.min": x.masked_fill(~keep, low),
        "causal -inf": x.masked_fill(~keep, float("-inf")),
        "causal finfo.min x8": (x * 8).masked_fill(~keep, low),
    }
    out = {
        f"{name} b{b} h{h} q{q}": median_us(lambda t=t: torch.softmax(t, -1, dtype=torch.float32))
        for name, t in cases.items()
    }
    wide = cases["causal finfo.min"].float()
    out[f"fp32 causal b{b} h{h} q{q}"] = median_us(lambda: torch.softmax(wide, -1))
    return out


def main() -> None:
    import torch

    torch.manual_seed(0)
    res: dict[str, float] = {}
    for b, h, q in ((2, 32, 2048), (4, 16, 2048), (1, 16, 4096)):
        res.update(probe(b, h, q))
        torch.cuda.empty_cache()
    for k, v in res.items():
        print(f"{v:9.1f} us  {k}")
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
