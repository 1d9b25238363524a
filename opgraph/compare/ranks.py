"""Ranks of multi-rank timelines: which ranks a timeline holds, one rank's view, and the pairs to compare.

Rank ``r`` of a ``--tp N`` simulation is compared with rank ``r`` of a trace (or with a one-rank trace);
ranks are never summed against one.
"""

from __future__ import annotations

from opgraph.compare.result import CompareError
from opgraph.ir import Timeline


def rank_of_track(track: str) -> int | None:
    """``3`` for ``rank3/...`` tracks, None for a single-rank track."""
    head = track.split("/", 1)[0]
    if head.startswith("rank") and head[4:].isdigit():
        return int(head[4:])
    return None


def ranks_of(timeline: Timeline) -> list[int]:
    """Ranks whose tracks a timeline holds (empty for a single-rank timeline)."""
    return sorted({r for s in timeline.spans if (r := rank_of_track(s.track)) is not None})


def rank_view(timeline: Timeline, rank: int) -> Timeline:
    """The spans of one rank, with the ``rank<r>/`` prefix dropped from their tracks."""
    prefix = f"rank{rank}/"
    spans = tuple(
        s.model_copy(update={"track": s.track[len(prefix) :]}) for s in timeline.spans if s.track.startswith(prefix)
    )
    config = dict(timeline.source.config)
    config["rank"] = rank
    return timeline.model_copy(update={"spans": spans, "source": timeline.source.model_copy(update={"config": config})})


RankPair = tuple[int | None, Timeline, Timeline]
"""A rank (None: both sides single-rank), its predicted and its reference timeline."""


def pair_ranks(
    predicted: Timeline, reference: Timeline, rank: int | None
) -> tuple[list[RankPair], RankPair, list[str]]:
    """The rank pairs to compare (rank r against rank r, never ranks summed against one), the pair to detail
    (``rank``, default the first) and notes; a ``rank`` neither side has is a :class:`CompareError`."""
    pred_ranks, ref_ranks = ranks_of(predicted), ranks_of(reference)
    notes: list[str] = []
    pairs: list[RankPair]
    if pred_ranks and ref_ranks:
        both = [r for r in pred_ranks if r in ref_ranks]
        if not both:
            raise CompareError(
                f"no rank in common: simulated ranks {pred_ranks}, trace ranks {ref_ranks}",
                hint="simulate with --tp matching the trace's ranks",
            )
        if rank is not None and rank not in both:
            raise CompareError(f"no rank {rank} on both sides", where="--rank", hint=f"ranks on both: {both}")
        pairs = [(r, rank_view(predicted, r), rank_view(reference, r)) for r in both]
        notes.append(f"ranks {both} compared rank by rank")
    elif pred_ranks:
        pr = rank if rank is not None else pred_ranks[0]
        if pr not in pred_ranks:
            raise CompareError(f"no rank {pr} in the simulation", where="--rank", hint=f"ranks: {pred_ranks}")
        pairs = [(pr, rank_view(predicted, pr), reference)]
        notes.append(f"rank {pr} of the {len(pred_ranks)}-rank simulation against the one-rank trace")
    elif ref_ranks:
        rr = rank if rank is not None else ref_ranks[0]
        if rr not in ref_ranks:
            raise CompareError(f"no rank {rr} in the trace", where="--rank", hint=f"ranks: {ref_ranks}")
        pairs = [(rr, predicted, rank_view(reference, rr))]
        notes.append(f"the one-rank simulation against rank {rr} of the {len(ref_ranks)}-rank trace")
    else:
        if rank not in (None, 0):
            raise CompareError(
                f"no rank {rank}: both timelines are single-rank",
                where="--rank",
                hint="leave out --rank; it picks a rank of a --tp N simulation or of a multi-rank trace",
            )
        pairs = [(None, predicted, reference)]
    detail = next((p for p in pairs if p[0] == rank), pairs[0])
    return pairs, detail, notes
