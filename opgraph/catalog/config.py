"""Compatibility: config identity lives in :mod:`opgraph.ir.configs` (replay shares it)."""

from opgraph.ir.configs import (
    CONFIG_HASH_VERSION,
    canonical_json,
    config_dict,
    config_hash,
    contiguous_strides,
    dtype_signature,
    hash_config_dict,
    is_contiguous,
    normalise_op,
    operation_name,
    size_label,
    tensor_layout,
)

__all__ = [
    "CONFIG_HASH_VERSION",
    "canonical_json",
    "config_dict",
    "config_hash",
    "contiguous_strides",
    "dtype_signature",
    "hash_config_dict",
    "is_contiguous",
    "normalise_op",
    "operation_name",
    "size_label",
    "tensor_layout",
]
