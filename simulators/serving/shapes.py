"""Batch shapes of serving steps and their buckets (the memo keys of step costs).

A step runs prefill parts (a sequence's next ``q_len`` prompt tokens over ``kv_len`` keys: its
prefix plus the chunk) and decodes (one token each over its own kv length). Its cost key rounds
each size up to a bucket: exact up to 16, then 16 values per octave (a step of 1/16 to 1/32 of the
size), so a bucketed size is at most 6.25% above the true one and a step's time, which also pays
for the weights, errs by less. Decodes enter as (count, mean kv length rounded up): attention of
one query is linear in its keys, so the mean keeps the keys read and the FLOPs.

A sliding-window layer reads at most its window's keys (a decode's cache holds ``window - 1`` tokens
plus the new one): its decodes read the mean of the capped lengths, ``mean(min(kv, window))``, which
is shorter than ``min(mean kv, window)`` when some decodes are inside the window and some past it.
Given the model's windows, the key names that mean (bucketed alike) for each window where it is
shorter; where it is not (every decode on one side of the window) the key is the windowless one.

>>> bucket(15), bucket(17), bucket(101), bucket(1000)
(15, 17, 104, 1024)
>>> StepShape(prefill=((101, 101),), decode_kv=(50, 70)).key()
StepKey(prefill=(PartKey(batch=1, q_len=104, kv_len=104),), decode_batch=2, decode_kv=60, decode_window_kv=())
>>> StepShape(decode_kv=(100, 10000)).key(windows=(128,)).decode_window_kv
(WindowKv(window=128, kv_len=116),)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["EXACT_UP_TO", "PER_OCTAVE", "PartKey", "StepKey", "StepShape", "WindowKv", "bucket"]

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


@dataclass(frozen=True, order=True)
class WindowKv:
    """The decodes' mean keys read by the sliding layers of one ``window`` (bucketed)."""

    window: int
    kv_len: int


@dataclass(frozen=True)
class StepKey:
    """A bucketed step: what a step cost is memoised by."""

    prefill: tuple[PartKey, ...] = ()
    decode_batch: int = 0
    decode_kv: int = 0
    """The decodes' mean keys (bucketed): what full-attention layers read."""
    decode_window_kv: tuple[WindowKv, ...] = ()
    """The decodes' mean keys read by the sliding layers of each window where they are fewer than
    ``min(decode_kv, window)`` (a batch with decodes inside and past the window), by window."""

    @property
    def window_kv(self) -> dict[int, int]:
        """:attr:`decode_window_kv` as window -> keys (what :func:`opgraph.transforms.rebatch` takes)."""
        return {w.window: w.kv_len for w in self.decode_window_kv}

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

    def key(self, windows: Iterable[int] = ()) -> StepKey:
        """The bucketed key: parts with equal bucketed sizes merge into one batch; decodes enter as their
        count and mean keys, and, for each of the model's sliding ``windows`` where it is fewer, the mean
        of their lengths capped at the window."""
        counts: dict[tuple[int, int], int] = {}
        for q, kv in self.prefill:
            bq = bucket(q)
            bkv = max(bq, bucket(kv)) if kv > q else bq
            counts[(bq, bkv)] = counts.get((bq, bkv), 0) + 1
        parts = tuple(sorted(PartKey(n, q, kv) for (q, kv), n in counts.items()))
        if not self.decode_kv:
            return StepKey(parts)
        n = len(self.decode_kv)
        mean_kv = max(2, bucket(math.ceil(sum(self.decode_kv) / n)))
        capped: list[WindowKv] = []
        for w in sorted(set(windows)):
            # A bucket may pass the window; no sliding layer reads more than it.
            keys = min(w, bucket(math.ceil(sum(min(kv, w) for kv in self.decode_kv) / n)))
            if keys < min(mean_kv, w):
                capped.append(WindowKv(w, keys))
        return StepKey(parts, bucket(n), mean_kv, tuple(capped))
