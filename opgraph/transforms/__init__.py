"""Graph transforms: rewrite an :class:`~opgraph.ir.OpGraph` into another (tensor-parallel sharding)."""

from opgraph.transforms.tensor_parallel import (
    DEFAULT_LINEAR_RULES,
    LinearRule,
    ParallelStyle,
    TensorParallelError,
    linear_style,
    register_handler,
    shard_tensor_parallel,
)

__all__ = [
    "DEFAULT_LINEAR_RULES",
    "LinearRule",
    "ParallelStyle",
    "TensorParallelError",
    "linear_style",
    "register_handler",
    "shard_tensor_parallel",
]
from opgraph.transforms.rebatch import (
    TEMPLATE_DECODE,
    TEMPLATE_PREFILL,
    AttentionPart,
    RebatchError,
    balanced_expert_rows,
    mixed_step,
    rebatch,
    source_shape,
)

__all__ += [
    "TEMPLATE_DECODE",
    "TEMPLATE_PREFILL",
    "AttentionPart",
    "RebatchError",
    "balanced_expert_rows",
    "mixed_step",
    "rebatch",
    "source_shape",
]
