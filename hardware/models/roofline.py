"""The roofline cost model: ``max(compute, memory) + launch`` with size-dependent efficiency.

- GEMMs: a wave model. The output is cut into CTA tiles (several candidate shapes, with split-K
  for skinny problems); tiles run in waves over the SMs and each wave takes one tile's time, so
  wave quantization and short reductions (``k``) cost what they cost on the device. The fastest
  candidate wins, as a library heuristic would pick it.
- Attention: a fused (flash) kernel at a fraction of tensor peak, scaled by how well its CTAs
  (``batch x heads x q blocks``, split along the keys when too few) fill the SMs, plus a fixed
  cost per CTA in keys. It uses ``op.flops``, which already counts only the query-key pairs that
  causal masking and windows keep: nothing is discounted twice.
- Pointwise, normalisation, reductions, gathers, copies: vector FLOPs against bytes moved at a
  bandwidth fraction that grows with the bytes (small ops cannot fill the memory system).
- Collectives: the alpha-beta model. Views: free.

Every op is either costed or raises :class:`~hardware.base.UncostedOpError` with the reason. The
per-kind rules are cost formulas registered with :func:`~hardware.models.dispatch.register_cost`
under ``"roofline"``; register your own for your op kind or class (or pass ``formulas=`` to one model).
"""

from __future__ import annotations

import dataclasses
import math

from hardware.base import Bound, Cost, UncostedOpError
from hardware.models.dispatch import FormulaDispatchModel, collective_cost, kind_name, register_cost, view_cost
from hardware.models.efficiency import RooflineParams
from hardware.spec import HardwareSpec
from opgraph.ir import Attention, DType, Gemm, OpBase, OpKind, Other

_POINTWISE_KINDS = (
    OpKind.NORM,
    OpKind.ROPE,
    OpKind.ACTIVATION,
    OpKind.ELEMENTWISE,
    OpKind.SOFTMAX,
    OpKind.REDUCTION,
    OpKind.TOPK,
    OpKind.MOE_ROUTING,
    OpKind.EMBEDDING,
    OpKind.MEMORY,
)


class RooflineModel(FormulaDispatchModel[RooflineParams]):
    """Roofline with per-kind, size-dependent efficiency, wave quantization and launch latency.

    Parameters
    ----------
    params:
        All assumptions; defaults suit Hopper-class GPUs. Keyword options override single fields
        (``RooflineModel(attention_efficiency=0.7)``).
    collective:
        The model for :class:`~opgraph.ir.Collective` ops (alpha-beta by default).
    formulas:
        Per-instance cost formulas by op kind or class, used before the registered ones.
    """

    name = "roofline"
    params_type = RooflineParams

    # -- shared pieces (for formulas, built-in and yours) --------------------------------------------

    def launch_s(self, hw: HardwareSpec) -> float:
        """Launch latency in seconds (the parameter's override, else the device's)."""
        us = self.params.launch_latency_us
        return (hw.launch_latency_us if us is None else us) * 1e-6

    def tensor_peak(self, dtype: DType, hw: HardwareSpec) -> float:
        """Tensor-unit peak for ``dtype``; fp32 stays off TF32 unless ``allow_tf32``."""
        if dtype is DType.fp32 and not self.params.allow_tf32:
            return float(hw.tensor.fp32 or hw.peak_flops(DType.fp32, tensor=False))
        return hw.peak_flops(dtype, tensor=True)

    def memory_s(self, kind: OpKind | str, nbytes: float, hw: HardwareSpec) -> tuple[float, float]:
        """(seconds, efficiency) to move ``nbytes`` for an op of ``kind``."""
        if nbytes <= 0:
            return 0.0, 1.0
        eff = self.params.memory_efficiency(kind, nbytes)
        return nbytes / (hw.memory_bandwidth * eff), eff

    def finish(
        self,
        op: OpBase,
        hw: HardwareSpec,
        compute_s: float,
        memory_s: float,
        compute_eff: float | None,
        memory_eff: float | None,
        detail: str = "",
    ) -> Cost:
        """Combine the terms: ``max(compute, memory) + launch``, the bound, the per-kind time scale."""
        launch = self.launch_s(hw)
        body = max(compute_s, memory_s)
        scale = self.params.time_factor(kind_name(op))
        if compute_s >= memory_s:
            bound, eff = Bound.COMPUTE, compute_eff
        else:
            bound, eff = Bound.MEMORY, memory_eff
        if launch >= body:
            bound = Bound.LAUNCH
        return Cost(
            (body + launch) * scale, bound, compute_s=compute_s, memory_s=memory_s, efficiency=eff, detail=detail
        )

    def vector_cost(self, op: OpBase, hw: HardwareSpec, kind: OpKind | str) -> Cost:
        """Vector FLOPs against bytes moved at ``kind``'s bandwidth curve (pointwise and generic ops)."""
        peak = hw.peak_flops(op.dtype, tensor=False) * self.params.vector_efficiency
        compute = op.flops / peak
        memory, m_eff = self.memory_s(kind, op.total_bytes, hw)
        return self.finish(op, hw, compute, memory, self.params.vector_efficiency, m_eff)


# -- per kind --------------------------------------------------------------------------------------


register_cost(RooflineModel, OpKind.VIEW)(view_cost)
register_cost(RooflineModel, OpKind.COLLECTIVE)(collective_cost)


@register_cost(RooflineModel, *_POINTWISE_KINDS)
def _pointwise(model: RooflineModel, op: OpBase, hw: HardwareSpec) -> Cost:
    return model.vector_cost(op, hw, kind_name(op))


@register_cost(RooflineModel, OpKind.OTHER)
def _other(model: RooflineModel, op: OpBase, hw: HardwareSpec) -> Cost:
    fn = op.fn if isinstance(op, Other) else ""
    name = fn or op.target or op.definition
    if not model.params.cost_other or (op.flops == 0 and op.total_bytes == 0):
        why = "costing of unrecognised ops is off" if not model.params.cost_other else "it has no FLOPs or bytes"
        raise UncostedOpError(
            f"unrecognised op {name!r} cannot be costed: {why}",
            hint="add a lowering for it, a table entry for its definition, or a custom cost model",
        )
    cost = model.vector_cost(op, hw, OpKind.OTHER)
    return dataclasses.replace(cost, detail=f"unrecognised op {name!r}: generic roofline from its FLOPs and bytes")


@register_cost(RooflineModel, OpKind.GEMM)
def _gemm(model: RooflineModel, op: OpBase, hw: HardwareSpec) -> Cost:
    if not isinstance(op, Gemm):
        raise UncostedOpError(f"op of kind gemm is a {type(op).__name__}, not a Gemm")
    if op.m == 0 or op.flops == 0:
        return Cost(model.launch_s(hw), Bound.LAUNCH, detail="empty GEMM")
    p = model.params
    peak = model.tensor_peak(op.dtype, hw)
    sms = hw.sm_count
    per_sm = peak / sms
    mult = op.batch * op.groups
    best: tuple[float, float, float, float, str] | None = None
    for tile in p.gemm_tiles:
        if tile.max_problem_m is not None and op.m > tile.max_problem_m:
            continue
        tiles = math.ceil(op.m / tile.m) * math.ceil(op.n / tile.n) * mult
        splits = [1]
        if op.m <= p.gemm_split_k_max_m:
            s = 2
            while s <= p.gemm_max_split_k and tiles * s <= sms:
                splits.append(s)
                s *= 2
        for split in splits:
            ctas = tiles * split
            waves = math.ceil(ctas / sms)
            k_per = math.ceil(op.k / split)
            compute = waves * 2 * tile.m * tile.n * (k_per + p.gemm_k_overhead) / (per_sm * tile.efficiency)
            # Split-K writes fp32 partials and reads them back to reduce.
            partials = 2 * split * op.m * op.n * 4 * mult if split > 1 else 0
            memory, m_eff = model.memory_s(OpKind.GEMM, op.total_bytes + partials, hw)
            total = max(compute, memory)
            if best is None or total < max(best[0], best[1]) * (1 - 1e-12):
                detail = f"tile {tile.m}x{tile.n}, split-k {split}, {ctas} CTAs in {waves} wave(s) on {sms} SMs"
                best = (compute, memory, m_eff, tile.efficiency, detail)
    if best is None:
        raise UncostedOpError("no GEMM tile applies to this shape", hint="check roofline gemm_tiles")
    compute, memory, m_eff, _, detail = best
    return model.finish(op, hw, compute, memory, op.flops / (compute * peak), m_eff, detail)


@register_cost(RooflineModel, OpKind.ATTENTION)
def _attention(model: RooflineModel, op: OpBase, hw: HardwareSpec) -> Cost:
    if not isinstance(op, Attention):
        raise UncostedOpError(f"op of kind attention is a {type(op).__name__}, not an Attention")
    p = model.params
    peak = model.tensor_peak(op.dtype, hw)
    sms = hw.sm_count
    ctas = op.batch * op.heads * math.ceil(op.q_len / p.attention_block_q)
    split = max(1, sms // ctas)  # split-KV (flash-decoding) when the grid is too small
    ctas *= split
    fill = ctas / (math.ceil(ctas / sms) * sms)
    pairs = max(op.pairs, 1)
    keys = pairs / op.q_len  # mean keys each query attends to, after masking
    compute = op.flops * (keys + p.attention_kv_overhead) / keys / (peak * p.attention_efficiency * fill)
    memory, m_eff = model.memory_s(OpKind.ATTENTION, op.total_bytes, hw)
    detail = f"{ctas} CTAs (split-kv {split}) fill {fill:.0%} of {sms} SMs, {keys:.0f} keys per query"
    return model.finish(op, hw, compute, memory, op.flops / (compute * peak) if compute else None, m_eff, detail)
