"""``gemm``: mm, addmm, bmm, baddbmm, grouped mm, and matmul/linear when they reach dispatch whole."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering
from opgraph.ir.ops import OpKind

_BIAS_FIRST = frozenset({"addmm", "baddbmm", "addbmm"})


@dataclass(frozen=True)
class LowerGemm:
    """One ``Gemm`` per matrix-multiply event."""

    name: ClassVar[str] = "gemm"

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            fn = ev.fn
            if fn in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "_grouped_mm", "dot"):
                t = ev.inputs
                if fn in _BIAS_FIRST:
                    if len(t) < 3:
                        continue
                    a, b, bias = t[1], t[2], True
                elif fn == "linear":
                    a, b, bias = t[0], t[1], len(t) > 2
                    n = b.shape[0]
                    k = b.shape[-1]
                    m = math.prod(a.shape[:-1])
                    lw.claim([ev.index], OpKind.GEMM, {"m": m, "n": n, "k": k, "bias": bias})
                    continue
                else:
                    if len(t) < 2:
                        continue
                    a, b, bias = t[0], t[1], False
                if fn == "_grouped_mm":
                    groups = b.shape[0] if len(b.shape) == 3 else 1
                    rows = a.shape[0]
                    n, k = b.shape[-1], a.shape[-1]
                    lw.claim(
                        [ev.index],
                        OpKind.GEMM,
                        {"m": rows // max(groups, 1), "n": n, "k": k, "groups": groups},
                        flops=2 * rows * n * k,
                    )
                    continue
                if fn in ("mv", "addmv", "dot"):
                    k = a.shape[-1]
                    m = math.prod(a.shape[:-1]) if fn != "dot" else 1
                    lw.claim([ev.index], OpKind.GEMM, {"m": m, "n": 1, "k": k, "bias": bias})
                    continue
                k = a.shape[-1]
                n = b.shape[-1] if len(b.shape) > 1 else 1
                m = a.shape[-2] if len(a.shape) > 1 else 1
                batch = math.prod(a.shape[:-2]) if len(a.shape) > 2 else 1
                if fn == "matmul" and len(a.shape) > 2 and len(b.shape) == 2:
                    m, batch = math.prod(a.shape[:-1]), 1
                lw.claim([ev.index], OpKind.GEMM, {"m": m, "n": n, "k": k, "batch": max(batch, 1), "bias": bias})
