"""Batch shapes of serving steps and their buckets (the memo keys of step costs).

A step runs prefill parts (a sequence's next ``q_len`` prompt tokens over ``kv_len`` keys: its
prefix plus the chunk) and decodes (one token each over its own kv length). Its cost key rounds
each size up to a bucket: exact up to 16, then 16 values per octave (a step of 1/16 to 1/32 of the
size), so a bucketed size is at most 6.25% above the true one and a step's time, which also pays
for the weights, errs by less. Decodes enter as (count, mean kv length rounded up): attention of
one query is linear in its keys, so the mean keeps the keys read and the FLOPs.

>>> bucket(15), bucket(17), bucket(101), bucket(1000)
(15, 17, 104, 1024)
>>> StepShape(prefill=((101, 101),), decode_kv=(50, 70)).key()
StepKey(prefill=(PartKey(batch=1, q_len=104, kv_len=104),), decode_batch=2, decode_kv=60)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EXACT_UP_TO", "PER_OCTAVE", "PartKey", "StepKey", "StepShape", "bucket"]

EXACT_UP_TO = 16
"""Sizes up to this are their own bucket."""
PER_OCTAVE = 16
"""Buckets per doubling above :data:`EXACT_UP_TO`."""


def bucket(x: int) -> int:
    """``x`` rounded up to its bucket (see the module docstring)."""
    if x <= EXACT_UP_TO:
        return x
    step = 1 << (x.bit_length() - 1 - (PER_OCTAVE.bit_length() - 1))
    return math.ceil(x / step) * step


@dataclass(frozen=True, order=True)
class PartKey:
    """``batch`` prefill sequences of ``q_len`` new tokens over ``kv_len`` keys each."""

    batch: int
    q_len: int
    kv_len: int


@dataclass(frozen=True)
class StepKey:
    """A bucketed step: what a step cost is memoised by."""

    prefill: tuple[PartKey, ...] = ()
    decode_batch: int = 0
    decode_kv: int = 0

    @property
    def tokens(self) -> int:
        """New tokens the step processes."""
        return sum(p.batch * p.q_len for p in self.prefill) + self.decode_batch

    @property
    def kind(self) -> str:
        """``prefill``, ``decode`` or ``mixed``."""
        if self.prefill and self.decode_batch:
            return "mixed"
        return "prefill" if self.prefill else "decode"


@dataclass(frozen=True)
class StepShape:
    """The exact shape of one step."""

    prefill: tuple[tuple[int, int], ...] = ()
    """(new tokens, keys attended) of each prefill part."""
    decode_kv: tuple[int, ...] = ()
    """Keys attended by each decode (its cache plus the new token)."""

    def key(self) -> StepKey:
        """The bucketed key: parts with equal bucketed sizes merge into one batch."""
        counts: dict[tuple[int, int], int] = {}
        for q, kv in self.prefill:
            bq = bucket(q)
            bkv = max(bq, bucket(kv)) if kv > q else bq
            counts[(bq, bkv)] = counts.get((bq, bkv), 0) + 1
        parts = tuple(sorted(PartKey(n, q, kv) for (q, kv), n in counts.items()))
        if not self.decode_kv:
            return StepKey(parts)
        mean_kv = math.ceil(sum(self.decode_kv) / len(self.decode_kv))
        return StepKey(parts, bucket(len(self.decode_kv)), max(2, bucket(mean_kv)))
