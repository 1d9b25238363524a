"""Does a memory-bound kernel pay for the dirty lines the kernel before it left in L2? The profile sweep flushes
L2 by reading a buffer twice its size (clean lines) before each timed call, so an op never pays for writing back
what the op before it wrote; in a model the op before it just wrote its output. Each case is timed after a read
flush (the sweep's), after a write flush (a buffer twice the L2 written: L2 full of dirty lines), and in the
sequence a decode layer runs (the KV cache's ``torch.cat`` right before the attention that reads it); then after
a read flush and a write of N MiB (N MiB of dirty lines), for N from 0 to 128.

Run on the GPU machine: ``python3 benchmarks/gpu/writeback_probe.py OUT.json``. Kernel durations from
torch.profiler (the sweep's timer counts the same), median over 30 calls, in microseconds.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def op_kernels_us(before: Callable[[], Any], op: Callable[[], Any], calls: int = 30) -> float:
    """Median summed duration of ``op``'s kernels, each call right after ``before``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        before()
        op()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        op()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    per = []
    for _ in range(calls):
        before()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            op()
            torch.cuda.synchronize()
        per.append(sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA" and e.name in names))
    return statistics.median(per)


def main() -> None:
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.zeros(2 * l2 // 4, dtype=torch.int32, device=dev)
    flushes: dict[str, Callable[[], Any]] = {"read flush": lambda: buf.max(), "write flush": lambda: buf.fill_(1)}
    res: dict[str, float] = {}
    dt = torch.float16
    for b, kv in ((16, 2048), (32, 2048), (8, 8192)):
        q = torch.randn(b, 1, 32, 128, device=dev, dtype=dt).transpose(1, 2)
        old_k = torch.randn(b, 8, kv - 1, 128, device=dev, dtype=dt)
        new_k = torch.randn(b, 8, 1, 128, device=dev, dtype=dt)
        k = torch.cat([old_k, new_k], dim=-2)
        v = torch.cat([old_k, new_k], dim=-2)

        def attn(k: Any = k, v: Any = v, q: Any = q) -> Any:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        def cat(old_k: Any = old_k, new_k: Any = new_k, k: Any = k) -> Any:
            return torch.cat([old_k, new_k], dim=-2, out=k)

        tag = f"b{b} kv{kv}"
        for label, flush in flushes.items():
            res[f"attention {tag} after {label}"] = op_kernels_us(flush, attn)
            res[f"kv cat {tag} after {label}"] = op_kernels_us(flush, cat)
        # as a decode layer runs them: the cache's cat (K, then V) right before the attention reads it
        res[f"attention {tag} after the K and V cats"] = op_kernels_us(lambda cat=cat: (buf.max(), cat(), cat()), attn)
        torch.cuda.empty_cache()
    x = torch.randn(32 * 2**20 // 2, device=dev, dtype=dt)
    y = torch.randn_like(x)
    for label, flush in flushes.items():
        res[f"add 32 MiB after {label}"] = op_kernels_us(flush, lambda: x + y)
    # How the penalty grows with the dirty bytes: a read flush (clean L2), then a write of N MiB (N MiB dirty).
    q = torch.randn(16, 1, 32, 128, device=dev, dtype=dt).transpose(1, 2)
    k = torch.randn(16, 8, 2048, 128, device=dev, dtype=dt)
    dirt = torch.zeros(128 * 2**20 // 4, dtype=torch.int32, device=dev)
    for mib in (0, 4, 8, 16, 32, 64, 128):
        dirty = dirt[: mib * 2**20 // 4]

        def before(dirty: Any = dirty) -> None:
            buf.max()
            dirty.fill_(2)

        res[f"add 32 MiB after {mib} MiB dirty"] = op_kernels_us(before, lambda: x + y)
        res[f"attention b16 kv2048 after {mib} MiB dirty"] = op_kernels_us(
            before, lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        )
    for k_, v_ in res.items():
        print(f"{v_:9.1f} us  {k_}", flush=True)
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
