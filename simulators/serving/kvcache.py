"""KV-cache accounting: bytes per token from the model's shape, capacity from the device's memory.

Per token: ``layers x kv_heads x head_dim x 2 (K and V) x dtype bytes / tp`` (each rank holds its
heads). Capacity: ``memory x utilisation - weights / tp`` per rank (vLLM's ``gpu_memory_utilization``).

>>> kv = KvCacheSpec.from_model(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2, tp=1,
...                             memory_bytes=80e9, weights_bytes=16e9, utilisation=0.9)
>>> kv.bytes_per_token, kv.capacity_tokens
(131072, 427246)
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from opgraph.ir import OpgraphError
from opgraph.ir.tensor import FrozenModel

__all__ = ["KvCacheError", "KvCacheSpec"]


class KvCacheError(OpgraphError):
    """The model does not fit the device (weights above the usable memory)."""


class KvCacheSpec(FrozenModel):
    """What the KV cache of one rank holds."""

    bytes_per_token: Annotated[int, Field(ge=1)]
    """Bytes one token's keys and values take on one rank, all layers."""
    capacity_bytes: Annotated[int, Field(ge=0)]
    """Bytes left for the cache on one rank."""
    weights_bytes: Annotated[int, Field(ge=0)] = 0
    """Weights on one rank."""
    memory_bytes: Annotated[int, Field(ge=0)] = 0
    """Device memory of one rank."""
    utilisation: float = 0.9
    """Share of the device memory the server may use."""

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache holds."""
        return self.capacity_bytes // self.bytes_per_token

    @classmethod
    def from_model(
        cls,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype_bytes: float,
        tp: int,
        memory_bytes: float,
        weights_bytes: float,
        utilisation: float = 0.9,
    ) -> KvCacheSpec:
        """The spec of a model on a device; raises :class:`KvCacheError` when the weights do not fit."""
        per_rank_heads = max(1, kv_heads // tp) if kv_heads >= tp else 1  # heads replicate below tp
        per_token = int(layers * per_rank_heads * head_dim * 2 * dtype_bytes)
        weights = int(weights_bytes / tp)
        usable = int(memory_bytes * utilisation)
        if weights >= usable:
            raise KvCacheError(
                f"weights ({weights / 1e9:.1f} GB per rank) exceed the usable memory "
                f"({usable / 1e9:.1f} GB = {utilisation:.0%} of {memory_bytes / 1e9:.1f} GB)",
                where="model/hardware",
                hint="use more tensor-parallel ranks (--tp) or a device with more memory",
            )
        return cls(
            bytes_per_token=per_token,
            capacity_bytes=usable - weights,
            weights_bytes=weights,
            memory_bytes=int(memory_bytes),
            utilisation=utilisation,
        )
