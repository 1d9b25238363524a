"""Tensor sharding states (split, partial, replicated) and the geometry of splitting a tensor."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opgraph.ir import OpBase, OpgraphError, TensorSpec


class TensorParallelError(OpgraphError):
    """A graph cannot be sharded for the requested tensor-parallel degree."""


@dataclass(frozen=True)
class Split:
    """A tensor whose rank-local part is ``1 / factor`` of it along one dimension."""

    factor: int
    block: int
    """Elements of the split dimension and all inner ones, unsharded, in the producer's layout."""
    full: TensorSpec
    """The unsharded tensor as its producer wrote it."""
    local: TensorSpec
    """The rank-local tensor as the sharded producer writes it."""


@dataclass(frozen=True)
class Partial:
    """A tensor every rank holds whole, but as a partial sum over the ranks."""

    spec: TensorSpec


@dataclass(frozen=True)
class PairSplit:
    """A tensor sized by the token-expert pairs of an experts call (leading dimension ``pairs``) of
    which a rank holds the pairs routed to its own experts (expert parallelism over transformers'
    ``batched_mm`` experts): :func:`local_pairs` of them, ``ceil(pairs / factor)``."""

    pairs: int
    """Token-expert pairs of the call: the leading dimension of the unsharded tensor."""
    factor: int
    full: TensorSpec
    """The unsharded tensor as its producer wrote it."""
    local: TensorSpec
    """The rank-local tensor as the sharded producer writes it."""


State = Split | Partial | PairSplit | None


def local_pairs(pairs: int, tp: int) -> int:
    """Token-expert pairs one rank of a ``tp``-way expert-parallel run multiplies: with balanced routing
    each rank's experts receive ``pairs / tp``; when ``tp`` does not divide them every rank is modelled
    as the busiest one, ``ceil(pairs / tp)`` (as the grouped experts' ``ceil(groups / tp)``).

    >>> local_pairs(24, 4), local_pairs(26, 4), local_pairs(1, 4)
    (6, 7, 1)
    """
    return -(-pairs // tp)


def scale_by_pairs(value: int, pairs: int, local: int) -> int:
    """A size field (``numel``, ``rows``) of an op on ``pairs`` token-expert pairs, on ``local`` of them.

    >>> scale_by_pairs(24 * 48, 24, 7), scale_by_pairs(5, 24, 7)
    (336, 2)
    """
    if value % pairs == 0:
        return value // pairs * local
    return max(1, -(-value * local // pairs))


def op_name(op: OpBase) -> str:
    """How messages name an op: its scope (or target) and kind."""
    return f"{op.scope or op.target or 'op'} ({op.kind.value})"


def reshard(spec: TensorSpec, dim: int, factor: int, *, ceil: bool = False) -> TensorSpec:
    """``spec`` with dimension ``dim`` divided by ``factor`` (strides of outer dims follow)."""
    shape = list(spec.shape)
    size = shape[dim]
    shape[dim] = -(-size // factor) if ceil else size // factor
    strides = spec.strides
    if strides is not None:
        inner = strides[dim] * size
        strides = tuple(
            s * shape[dim] // size if i != dim and s >= inner > 0 and (s * shape[dim]) % size == 0 else s
            for i, s in enumerate(strides)
        )
    return spec.model_copy(update={"shape": tuple(shape), "strides": strides})


def retag(spec: TensorSpec, tensor_id: int) -> TensorSpec:
    """``spec`` as another tensor (the whole tensor a collective writes)."""
    return spec.model_copy(update={"id": tensor_id})


def ints(value: object) -> Iterable[int]:
    """Every integer in a recorded call's arguments (nested lists and dicts; booleans are not)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from ints(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from ints(v)


def pick_dim(
    shape: Sequence[int],
    factor: int,
    block: int | None,
    hints: set[int],
    strides: Sequence[int] | None = None,
) -> int | None:
    """The dimension of ``shape`` to split by ``factor`` (None when none divides).

    First the dimension whose extent (it and the dims inside it) is the producer's split
    ``block`` (broadcast dims of stride 0 count as 1), then a dimension the size of the layer's
    head counts, then the last dimension, then any.
    """

    def ok(d: int) -> bool:
        return shape[d] > 1 and shape[d] % factor == 0 and not (strides is not None and strides[d] == 0)

    rank = len(shape)
    if block is not None:
        dense = [1 if strides is not None and strides[i] == 0 else n for i, n in enumerate(shape)]
        for d in range(rank):
            if dense[d] > 1 and math.prod(dense[d:]) == block:
                if ok(d):
                    return d
                break
    start = 1 if rank >= 3 else 0
    for d in range(start, rank):
        if shape[d] in hints and ok(d):
            return d
    if rank and ok(rank - 1):
        return rank - 1
    for d in reversed(range(rank)):
        if ok(d):
            return d
    return None


def head_dim(shape: Sequence[int], heads: Sequence[int], factor: int) -> int | None:
    """Head dimension of an attention tensor: dim 1 of [b, h, s, d], dim 0 of [b*h, s, d]."""
    rank = len(shape)
    order = [1, 2] if rank >= 4 else [0, 1] if rank == 3 else list(range(rank))
    for d in order:
        if d < rank and shape[d] in heads and shape[d] % factor == 0 and shape[d] > 1:
            return d
    return None


def dim_of_size(shape: Sequence[int], size: int, *, prefer_last: bool) -> int | None:
    """The dimension of ``shape`` of the given size: last first, or second-to-last first."""
    rank = len(shape)
    order = list(reversed(range(rank)))
    if not prefer_last and rank >= 2:
        order = [rank - 2, rank - 1, *range(rank - 3, -1, -1)]
    return next((d for d in order if shape[d] == size), None)
