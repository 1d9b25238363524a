"""Does ``_grouped_mm``'s time depend on how a router deals its rows? The same expert GEMM (the total rows,
experts and weights fixed) with even loads (what the profile sweep measures), with the loads a uniform
router deals (each token picks ``top_k`` distinct experts at random: a multinomial spread), and with the
loads a skewed router deals (Zipf 0.8, as ``--moe-skew 0.8``).

Run on the GPU machine: ``python3 benchmarks/gpu/grouped_loads_probe.py OUT.json``. Times each case by the
sum of its kernels' durations in torch.profiler sessions (the sweep's default timer), median of 9 sessions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SHAPES = (
    # name, tokens, experts, top_k, n, k
    ("mixtral gate_up s1024", 1024, 8, 2, 2 * 14336, 4096),
    ("mixtral down s1024", 1024, 8, 2, 4096, 14336),
    ("mixtral gate_up s4096", 4096, 8, 2, 2 * 14336, 4096),
    ("qwen3moe gate_up s2048", 2048, 128, 8, 2 * 768, 2048),
    ("qwen3moe down s2048", 2048, 128, 8, 2048, 768),
    ("qwen3moe gate_up s512", 512, 128, 8, 2 * 768, 2048),
)


def uniform_loads(tokens: int, experts: int, top_k: int, gen: Any) -> list[int]:
    """Rows per expert when each token picks ``top_k`` distinct experts uniformly."""
    import torch

    picks = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=-1).indices.flatten()
    return torch.bincount(picks, minlength=experts).tolist()


def kernels_us(fn: Any, sessions: int = 9, calls: int = 5) -> tuple[float, list[str]]:
    """Median over sessions of the summed kernel time of one call, and the kernels' names."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per, names = [], set()
    for _ in range(sessions):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
        names.update(e.name[:90] for e in evs)
        per.append(sum(e.device_time for e in evs) / calls)
    return sorted(per)[len(per) // 2], sorted(names)


def main() -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from validators.inputs import routing_counts

    gen = torch.Generator().manual_seed(0)
    grouped = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    res: dict[str, Any] = {}
    for name, tokens, experts, top_k, n, k in SHAPES:
        rows = tokens * top_k
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
        cases = {
            "even": routing_counts(tokens, experts, top_k),
            "uniform": uniform_loads(tokens, experts, top_k, gen),
            "uniform2": uniform_loads(tokens, experts, top_k, gen),
            "zipf0.8": routing_counts(tokens, experts, top_k, 0.8),
        }
        for label, counts in cases.items():
            offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
            us, kern = kernels_us(lambda x=x, wt=w.transpose(-1, -2), offs=offs: grouped(x, wt, offs=offs))
            tiles = sum(-(-c // 128) for c in counts)
            res[f"{name} {label}"] = {"us": us, "tiles128": tiles, "max": max(counts), "kernels": kern}
            print(f"{us:9.1f} us  tiles {tiles:5d} max {max(counts):5d}  {name} {label}", flush=True)
        torch.cuda.empty_cache()
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
