"""Numeric check of a replayed op against a float64 reference, with tolerances by dtype.

The reference runs the same recipe on float64 copies of the very inputs the device used (on the
CPU by default), so the only differences are the device's rounding and accumulation order. An
element passes when ``|out - ref| <= atol * rms(ref) + rtol * |ref|``: the absolute term scales
with the output's magnitude, so a GEMM over a long K (outputs of size ~sqrt(K)) is judged as
fairly as a norm (outputs of size ~1). Integer and boolean outputs must match exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opgraph.ir import DType, OpBase, OpKind
from validators.recipes.base import Case, Compare
from validators.results import NumericCheck

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Tolerance:
    """Tolerances of one dtype."""

    atol: float
    """Absolute tolerance, as a fraction of the reference's RMS."""
    rtol: float
    """Relative tolerance."""


TOLERANCES: dict[DType, Tolerance] = {
    DType.fp64: Tolerance(1e-10, 1e-10),
    DType.fp32: Tolerance(1e-4, 1e-4),
    DType.tf32: Tolerance(5e-3, 5e-3),
    DType.bf16: Tolerance(1.6e-2, 1.6e-2),
    DType.fp16: Tolerance(2e-3, 2e-3),
    DType.fp8_e4m3: Tolerance(1.25e-1, 1.25e-1),
    DType.fp8_e5m2: Tolerance(2.5e-1, 2.5e-1),
    DType.fp4: Tolerance(5e-1, 5e-1),
}
"""Tolerances by the least precise floating dtype the op touches (a few ulps of that dtype)."""

_PRECISION_ORDER = [
    DType.fp4,
    DType.fp8_e5m2,
    DType.fp8_e4m3,
    DType.bf16,
    DType.fp16,
    DType.tf32,
    DType.fp32,
    DType.fp64,
]


def check_dtype(op: OpBase) -> DType:
    """The least precise floating dtype among the op's dtype and tensors (what tolerances follow)."""
    floats = {t.dtype for t in (*op.inputs, *op.outputs) if t.dtype in TOLERANCES}
    if op.dtype in TOLERANCES:
        floats.add(op.dtype)
    for d in _PRECISION_ORDER:
        if d in floats:
            return d
    return DType.fp32


def flatten(value: Any) -> list[Any]:
    """The tensors of an output pytree (tuples, lists, dicts), in order; other leaves are dropped."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flatten(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flatten(value[k])]
    return []


def reference_inputs(inputs: tuple[Any, ...], device: torch.device) -> tuple[Any, ...]:
    """Float64 copies of the inputs on ``device`` (integer and boolean tensors keep their dtype)."""
    import torch

    def conv(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            dt = torch.float64 if (v.dtype.is_floating_point or v.dtype.is_complex) else v.dtype
            if v.dtype.is_complex:
                dt = torch.complex128
            return v.detach().to(device=device, dtype=dt, copy=True)
        if isinstance(v, list | tuple):
            return type(v)(conv(x) for x in v)
        return v

    return tuple(conv(v) for v in inputs)


def compare(
    out: Any,
    ref: Any,
    dtype: DType,
    mode: Compare,
    *,
    reference_device: str = "cpu",
    note: str = "",
    min_scale: float = 0.0,
) -> NumericCheck:
    """Compare the device outputs with the reference; a :class:`NumericCheck` with the worst errors.

    The absolute tolerance scales with ``max(rms(reference), min_scale)``; attention passes the RMS of
    its values, since its output (an average of values) is far smaller than the values it rounds.
    """
    import torch

    tol = TOLERANCES.get(dtype, TOLERANCES[DType.fp32])
    if mode is Compare.NONE:
        return NumericCheck(ok=True, dtype=dtype.value, reference_device=reference_device, note=note or "not compared")
    outs, refs = flatten(out), flatten(ref)
    if mode is Compare.FIRST:
        outs, refs = outs[:1], refs[:1]
    if len(outs) != len(refs):
        return NumericCheck(
            ok=False, dtype=dtype.value, reference_device=reference_device,
            note=f"{len(outs)} outputs, reference has {len(refs)}",
        )  # fmt: skip
    max_abs = max_rel = 0.0
    atol_used = 0.0
    compared = 0
    problems: list[str] = []
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        is_float = o.dtype.is_floating_point or o.dtype.is_complex
        if mode is Compare.FLOAT_ONLY and not is_float:
            continue
        if tuple(o.shape) != tuple(r.shape):
            problems.append(f"output {i} shape {tuple(o.shape)} != reference {tuple(r.shape)}")
            continue
        compared += 1
        o64 = o.detach().to("cpu", torch.float64) if not o.dtype.is_complex else o.detach().to("cpu").abs().double()
        r64 = r.detach().to("cpu", torch.float64) if not r.dtype.is_complex else r.detach().to("cpu").abs().double()
        if not is_float:
            bad = int((o64 != r64).sum())
            if bad:
                problems.append(f"output {i}: {bad} of {o64.numel()} integer values differ")
                max_abs = max(max_abs, float((o64 - r64).abs().max()))
            continue
        if o64.numel() == 0:
            continue
        both_nan = torch.isnan(o64) & torch.isnan(r64)
        same_inf = torch.isinf(o64) & (o64 == r64)
        skip = both_nan | same_inf
        finite_ref = r64[torch.isfinite(r64)]
        rms = float(finite_ref.pow(2).mean().sqrt()) if finite_ref.numel() else 1.0
        scale = rms if rms > 0 and math.isfinite(rms) else 1.0
        scale = max(scale, min_scale)
        atol = tol.atol * scale
        atol_used = max(atol_used, atol)
        diff = (o64 - r64).abs().masked_fill(skip, 0.0)
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        limit = atol + tol.rtol * r64.abs().masked_fill(skip, 0.0)
        worst = float(diff.max())
        rel = float((diff / r64.abs().clamp_min(atol)).masked_fill(skip, 0.0).max())
        max_abs = max(max_abs, worst)
        max_rel = max(max_rel, rel)
        over = int((diff > limit).sum())
        if over:
            problems.append(f"output {i}: {over} of {o64.numel()} values beyond tolerance (max abs {worst:.3g})")
    ok = not problems
    text = "; ".join(problems) if problems else note
    return NumericCheck(
        ok=ok,
        max_abs=max_abs if math.isfinite(max_abs) else 1e308,
        max_rel=max_rel if math.isfinite(max_rel) else 1e308,
        atol=atol_used,
        rtol=tol.rtol,
        dtype=dtype.value,
        compared=compared,
        reference_device=reference_device,
        note=text[:500],
    )


def check_case(case: Case, op: OpBase, out: Any, ref_inputs: tuple[Any, ...], reference_device: str) -> NumericCheck:
    """Run the reference of ``case`` on ``ref_inputs`` and compare it with the device output ``out``."""
    dtype = check_dtype(op)
    if case.compare is Compare.NONE:
        return compare(out, None, dtype, Compare.NONE, reference_device=reference_device, note=case.note)
    try:
        ref = case.run(ref_inputs, True)
    except Exception as exc:
        msg = " ".join(str(exc).split())[:200]
        return NumericCheck(
            ok=True, dtype=dtype.value, reference_device=reference_device,
            note=f"no float64 reference: {type(exc).__name__}: {msg}",
        )  # fmt: skip
    min_scale = 0.0
    if op.kind is OpKind.ATTENTION:
        import torch

        floats = [t for t in ref_inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
        if floats:
            min_scale = max(float(t.double().pow(2).mean().sqrt()) for t in floats)
    return compare(
        out, ref, dtype, case.compare, reference_device=reference_device, note=case.note, min_scale=min_scale
    )
