"""Toy host-timed graphs with known framework gaps, and a host profile fitted from them."""

from __future__ import annotations

from hardware.hostfit import fit_host_profile
from hardware.hostprofile import HostProfile, module_role
from opgraph.ir import (
    CaptureSettings,
    Elementwise,
    Gemm,
    GraphMetadata,
    HostTimingSummary,
    Norm,
    OpBase,
    OpGraph,
    Stage,
)

# The "true" framework time of a toy host: what the fit must find. Entering a module costs its
# Python; a later op of the same call costs little.
TRUE_GAP = {
    ("norm", "model.layers.*.input_layernorm", "entry"): 40.0,
    ("gemm", "model.layers.*.mlp.up_proj", "entry"): 25.0,
    ("elementwise", "model.layers.*.mlp", "entry"): 12.0,
    ("elementwise", "model.layers.*.mlp", "inner"): 3.0,
}


def layer_ops(layer: int, start: int, noise: float) -> list[OpBase]:
    """One toy layer: norm, up_proj, two elementwise ops in the mlp, gaps = true gap + noise."""

    def gap(kind: str, scope: str, pos: str) -> float:
        return TRUE_GAP[(kind, module_role(scope), pos)] + noise

    s = Stage.DECODE
    norm_scope, up_scope, mlp_scope = (
        f"model.layers.{layer}.input_layernorm",
        f"model.layers.{layer}.mlp.up_proj",
        f"model.layers.{layer}.mlp",
    )
    return [
        Norm(id=start, hidden=64, rows=4, target="LlamaRMSNorm", scope=norm_scope, stage=s,
             host_gap_us=gap("norm", norm_scope, "entry")),
        Gemm(id=start + 1, m=4, n=64, k=64, target="aten.mm.default", scope=up_scope, stage=s,
             host_gap_us=gap("gemm", up_scope, "entry")),
        Elementwise(id=start + 2, fn="mul", numel=256, target="aten.mul.Tensor", scope=mlp_scope, stage=s,
                    host_gap_us=gap("elementwise", mlp_scope, "entry")),
        Elementwise(id=start + 3, fn="add", numel=256, target="aten.add.Tensor", scope=mlp_scope, stage=s,
                    host_gap_us=gap("elementwise", mlp_scope, "inner")),
    ]  # fmt: skip


def toy_graph(layers: int, noise: float = 0.0, *, timed: bool = True, cpu: str = "Toy CPU") -> OpGraph:
    """``layers`` toy layers; with ``timed``, gaps as a host-timed capture on ``cpu`` would carry."""
    ops: list[OpBase] = []
    for layer in range(layers):
        ops += layer_ops(layer, 4 * layer, noise)
    if not timed:
        ops = [op.model_copy(update={"host_gap_us": None}) for op in ops]
    timing = HostTimingSummary(total_us=sum(op.host_gap_us or 0.0 for op in ops), cpu=cpu) if timed else None
    md = GraphMetadata(model="toy", phase="decode", capture=CaptureSettings(batch=1, host_timing=timing))
    return OpGraph(metadata=md, ops=tuple(ops))


def toy_profile(**update: object) -> HostProfile:
    """Fitted from three toy graphs whose gaps are the truth plus -1, 0 and +1 us."""
    return fit_host_profile([toy_graph(2, -1.0), toy_graph(3, 0.0), toy_graph(2, 1.0)]).model_copy(update=update)
