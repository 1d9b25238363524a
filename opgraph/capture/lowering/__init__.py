"""Lowering passes: from the recorded aten stream to typed IR ops.

Each pass is a small frozen dataclass with a ``name`` (options are its fields), registered in
:data:`PASSES`. :data:`DEFAULT_PIPELINE` is the order :func:`lower` runs them in; a user pass is
added by ``PASSES.register(name, cls)`` or given as ``package.module:Class``.
"""

from __future__ import annotations

from opgraph.capture.lowering.base import FREE, Group, GroupFieldsError, Hints, Lowering, LoweringPass
from opgraph.ir.registry import Registry

PASSES: Registry[type[LoweringPass]] = Registry("lowering pass", entry_point_group="opgraph.lowering_passes")
"""Lowering passes by name."""

for _name, _spec in (
    ("fold-views", "opgraph.capture.lowering.views:FoldViews"),
    ("attention", "opgraph.capture.lowering.attention:LowerAttention"),
    ("moe", "opgraph.capture.lowering.moe:LowerMoe"),
    ("norm", "opgraph.capture.lowering.norm:FuseNorms"),
    ("rope", "opgraph.capture.lowering.rope:FuseRope"),
    ("embedding", "opgraph.capture.lowering.embedding:LowerEmbedding"),
    ("activation", "opgraph.capture.lowering.activation:LowerActivations"),
    ("gemm", "opgraph.capture.lowering.gemm:LowerGemm"),
    ("softmax", "opgraph.capture.lowering.softmax:LowerSoftmax"),
    ("topk", "opgraph.capture.lowering.topk:LowerTopK"),
    ("memory", "opgraph.capture.lowering.memory:LowerMemory"),
    ("pointwise", "opgraph.capture.lowering.pointwise:LowerPointwise"),
    ("other", "opgraph.capture.lowering.other:KeepOther"),
):
    PASSES.register_lazy(_name, _spec)

DEFAULT_PIPELINE: tuple[str, ...] = (
    "fold-views",
    "attention",
    "moe",
    "norm",
    "rope",
    "embedding",
    "activation",
    "gemm",
    "softmax",
    "topk",
    "memory",
    "pointwise",
    "other",
)
"""Pass order: structure first (attention, MoE, modules), then one op per remaining event."""


def run_passes(lw: Lowering, pipeline: tuple[str, ...] = DEFAULT_PIPELINE) -> Lowering:
    """Run the named passes (default options) over ``lw`` in order."""
    for name in pipeline:
        lw.current_pass = name
        PASSES.get(name)().run(lw)
    lw.current_pass = ""
    return lw


__all__ = [
    "DEFAULT_PIPELINE",
    "FREE",
    "PASSES",
    "Group",
    "GroupFieldsError",
    "Hints",
    "Lowering",
    "LoweringPass",
    "run_passes",
]
