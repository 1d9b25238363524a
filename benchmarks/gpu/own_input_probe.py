"""Does a kernel pay for dirty L2 lines when they are its own input? In a model the op before an op most often
wrote that op's input, so the dirty lines it leaves are lines the op reads (hits) as well as lines to write
back. ``writeback_probe.py`` measured dirty lines of an unrelated buffer; here each op is timed, after the
sweep's read flush, in four states of its produced input X (the tensor the op before would have written):

- ``cold``: nothing more (the sweep's state for an input it does not warm);
- ``warm``: X read back (clean lines: the sweep's state for a warm activation);
- ``own dirty``: X written in place (``mul_(1)``: dirty lines of X, the newest in L2, as its producer leaves them);
- ``other dirty``: as many bytes of an unrelated buffer written (what ``writeback_probe.py`` measured).

First, an ``add`` of a 32 MiB X right after X was written by each kind of kernel (``mul_``, ``copy_``, ``cat``,
``mm``, SDPA): which writers leave their output dirty.

Ops (bf16): an ``add`` of X and another tensor, an HF-style RMSNorm of X, SwiGLU over X (gate and up halves of
one projection), a transposed copy of X made contiguous, and SDPA decode attention over a cache X (its values
and keys), at several sizes of X.

Run on the GPU machine: ``python3 benchmarks/gpu/own_input_probe.py OUT.json``. Kernel durations from
torch.profiler, median over 30 calls (``writeback_probe.op_kernels_us``), in microseconds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from writeback_probe import op_kernels_us


def rms_norm(x: Any, w: Any) -> Any:
    """Transformers' ``LlamaRMSNorm.forward``."""
    import torch

    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def states(flush: Any, other: Any, x: Any) -> dict[str, Callable[[], Any]]:
    """What runs before each timed call: the read flush, then X left as each state has it."""
    part = other[: x.numel() * x.element_size() // 4]
    return {
        "cold": lambda: flush.max(),
        "warm": lambda: (flush.max(), x.max()),
        "own dirty": lambda: (flush.max(), x.mul_(1)),
        "other dirty": lambda: (flush.max(), part.fill_(1)),
    }


def pointwise(flush: Any, other: Any, mib: int) -> dict[str, float]:
    """The add, RMSNorm, SwiGLU and transposed copy over an X of ``mib`` MiB, in each state."""
    import torch
    import torch.nn.functional as F

    dt = torch.bfloat16
    n = mib * 2**20 // 2
    hidden, inter = 4096, 14336
    x = torch.randn(n // hidden, hidden, device="cuda", dtype=dt)
    y = torch.randn_like(x)
    w = torch.ones(hidden, device="cuda", dtype=dt)
    gate_up = torch.randn(n // (2 * inter), 2 * inter, device="cuda", dtype=dt)
    xt = torch.randn(1, n // (32 * 128), 32, 128, device="cuda", dtype=dt)
    ops: dict[str, tuple[Any, Callable[[], Any]]] = {
        "add": (x, lambda: x + y),
        "rmsnorm": (x, lambda: rms_norm(x, w)),
        "swiglu": (gate_up, lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:]),
        "transposed copy": (xt, lambda: xt.transpose(1, 2).contiguous()),
    }
    return {
        f"{name} {mib} MiB after {state}": op_kernels_us(before, op)
        for name, (inp, op) in ops.items()
        for state, before in states(flush, other, inp).items()
    }


def decode_attention(flush: Any, other: Any, b: int, kv: int) -> dict[str, float]:
    """SDPA decode attention (32 query heads over 8 of 128) over one cache X as keys and values, in each state."""
    import torch
    import torch.nn.functional as F

    dt = torch.bfloat16
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=dt).transpose(1, 2)
    cache = torch.randn(b, 8, kv, 128, device="cuda", dtype=dt)
    mib = cache.numel() * 2 // 2**20

    def attn() -> Any:
        return F.scaled_dot_product_attention(q, cache, cache, enable_gqa=True)

    return {
        f"decode attention b{b} kv{kv} ({mib} MiB cache) after {state}": op_kernels_us(before, attn)
        for state, before in states(flush, other, cache).items()
    }


def producers(flush: Any) -> dict[str, float]:
    """An ``add`` reading a 32 MiB X right after each kind of kernel wrote X (after the read flush): which
    writers leave their output dirty in L2."""
    import torch
    import torch.nn.functional as F

    dt = torch.bfloat16
    x = torch.empty(4096, 4096, device="cuda", dtype=dt)
    y = torch.randn_like(x)
    src = torch.randn_like(x)
    a = torch.randn(4096, 4096, device="cuda", dtype=dt)
    halves = (torch.randn(4096, 2048, device="cuda", dtype=dt), torch.randn(4096, 2048, device="cuda", dtype=dt))
    q = torch.randn(1, 32, 4096, 128, device="cuda", dtype=dt)
    kv = torch.randn(1, 8, 4096, 128, device="cuda", dtype=dt)
    out = {"x": x}

    def sdpa() -> None:
        out["x"] = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)

    writers: dict[str, Callable[[], Any]] = {
        "nothing (warm)": lambda: x.max(),
        "mul_": lambda: x.mul_(1),
        "copy_": lambda: x.copy_(src),
        "cat": lambda: torch.cat(halves, dim=1, out=x),
        "mm": lambda: torch.mm(a, src, out=x),
        "sdpa": sdpa,
    }
    res = {}
    for name, write in writers.items():
        res[f"add 32 MiB after {name} wrote its input"] = op_kernels_us(
            lambda write=write: (flush.max(), write()), lambda: out["x"].view(4096, 4096) + y
        )
    return res


def main() -> None:
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.zeros(2 * l2 // 4, dtype=torch.int32, device="cuda")
    other = torch.zeros(128 * 2**20 // 4, dtype=torch.int32, device="cuda")
    res: dict[str, float] = {"l2_bytes": float(l2)}
    res |= producers(flush)
    for mib in (8, 32, 64):
        res |= pointwise(flush, other, mib)
        torch.cuda.empty_cache()
    for b, kv in ((4, 8192), (16, 2048), (32, 2048)):
        res |= decode_attention(flush, other, b, kv)
        torch.cuda.empty_cache()
    for k_, v_ in res.items():
        print(f"{v_:11.1f}  {k_}", flush=True)
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
