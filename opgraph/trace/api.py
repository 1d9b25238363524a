"""Public entry points: load measured timelines from traces and analyze them."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from opgraph.ir.errors import OpgraphError
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.timeline import Timeline
from opgraph.trace.analysis import Analyzer, Label
from opgraph.trace.classify import KernelClassifier
from opgraph.trace.events import TraceData
from opgraph.trace.importer import collect_all, from_timeline, to_timeline
from opgraph.trace.patterns import PatternSet, load_patterns
from opgraph.trace.result import AnalysisResult, CollectiveInfo, RankSummary

P = ParamSpec("P")
R = TypeVar("R")


def _paused(func: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused_gc():
            return func(*args, **kwargs)

    return wrapper


PatternsArg = PatternSet | Sequence[str | Path] | None
"""A loaded :class:`PatternSet`, extra pattern files or folders, or None for the defaults."""


def _patterns(patterns: PatternsArg) -> PatternSet:
    if isinstance(patterns, PatternSet):
        return patterns
    return load_patterns(list(patterns or ()))


@dataclass
class RankAlignment:
    """Clock shift of one rank relative to rank 0, from matching collective kernels."""

    rank: int
    offset_us: float
    residual_us: float
    matched: int


def align_ranks(ranks: Sequence[TraceData]) -> list[RankAlignment]:
    """Align rank clocks on collectives: the k-th collective of a given name ends at the same moment on
    every rank (it completes together), so the median end difference to rank 0 is the clock offset."""
    if not ranks:
        return []

    def ends(d: TraceData) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for g in d.gpu:
            if g.ktype == "communication":
                out[g.name].append(g.ts + g.dur + d.origin_us)
        return out

    ref = ends(ranks[0])
    result = []
    for d in ranks:
        mine = ends(d)
        diffs = [r - m for name, lst in mine.items() for r, m in zip(ref.get(name, []), lst, strict=False)]
        if not diffs:
            result.append(RankAlignment(d.rank or 0, 0.0, 0.0, 0))
            continue
        off = statistics.median(diffs)
        res = statistics.median(abs(x - off) for x in diffs)
        result.append(RankAlignment(d.rank or 0, off, res, len(diffs)))
    return result


def load_trace_data(path: str | Path, *, python: bool = False, modules: bool = True) -> list[TraceData]:
    """Every rank at ``path``, imported and linked (the raw form behind :func:`load_trace`).

    ``python`` keeps every ``python_function`` event (the Python stack of ``with_stack=True``); without
    it only the ``nn.Module: ...`` ones are kept (unless ``modules`` is false): the module scopes the
    classifier reads, which :func:`load_trace` and :func:`analyze` keep as well."""
    return collect_all(path, python=python, modules=modules)


def _check_rank(datas: Sequence[TraceData], rank: int, path: str | Path) -> None:
    """Raise unless ``datas`` hold ``rank`` (a single trace without rank info holds rank 0)."""
    ranks = [d.rank if d.rank is not None else 0 for d in datas]
    if rank in ranks:
        return
    hint = f"ranks: {ranks}"
    if len(datas) == 1 and datas[0].rank is None:
        hint += "; a single-rank trace without distributedInfo is rank 0"
    raise OpgraphError(f"no rank {rank} in the trace", where=str(path), hint=hint)


@_paused
def load_traces(
    path: str | Path, *, cpu: bool = True, patterns: PatternsArg = None, analyzed: bool = True
) -> list[Timeline]:
    """One measured ``Timeline`` per rank at ``path`` (``.json``, ``.json.gz``, a folder, a ``.tar.gz``).

    Kernel spans carry their type as ``category``; with ``analyzed`` also ``layer``, ``stage`` and
    ``step`` (forward pass). ``cpu`` keeps host spans (CPU ops, launches, annotations).
    """
    ps = _patterns(patterns)
    clf = KernelClassifier(ps)
    out = []
    for d in collect_all(path):
        labels: list[Label] | None = None
        if analyzed:
            labels = Analyzer(ps, clf).labels(d)
        else:
            Analyzer(ps, clf).classify(d)
        out.append(to_timeline(d, cpu=cpu, labels=labels))
    return out


@_paused
def load_trace(
    path: str | Path, *, cpu: bool = True, rank: int | None = None, patterns: PatternsArg = None
) -> Timeline:
    """The measured ``Timeline`` of a trace: GPU kernels (typed, with layer, stage and pass) and, with
    ``cpu``, host spans. A multi-rank input gives ``rank`` (default: all ranks in one timeline, their
    tracks prefixed ``rank<r>/`` and clocks aligned on collectives).

    A ``rank`` the trace does not hold is an :class:`OpgraphError` naming the ranks it does, for a
    single-rank trace as for a multi-rank one: a single-rank trace holds the rank its
    ``distributedInfo`` names, or rank 0 when it names none (a trace recorded without distributed
    info is taken as rank 0, so ``rank=0`` selects it).
    """
    ps = _patterns(patterns)
    clf = KernelClassifier(ps)
    datas = collect_all(path)
    if rank is not None:
        _check_rank(datas, rank, path)
    labels = [Analyzer(ps, clf).labels(d) for d in datas]
    if len(datas) == 1:
        return to_timeline(datas[0], cpu=cpu, labels=labels[0])
    if rank is not None:
        for d, lab in zip(datas, labels, strict=True):
            if d.rank == rank:
                return to_timeline(d, cpu=cpu, labels=lab)
    align = {a.rank: a for a in align_ranks(datas)}
    origin = min(d.origin_us + align[d.rank or 0].offset_us for d in datas)
    parts = [
        to_timeline(
            d,
            cpu=cpu,
            labels=lab,
            track_prefix=f"rank{d.rank}/",
            offset_us=d.origin_us + align[d.rank or 0].offset_us - origin,
        )
        for d, lab in zip(datas, labels, strict=True)
    ]
    spans = tuple(s for tl in parts for s in tl.spans)
    first = parts[0]
    notes = [f"rank{d.rank}: {n}" for d, tl in zip(datas, parts, strict=True) for n in tl.notes]
    notes += [
        f"rank{a.rank}: clock shifted {a.offset_us:.1f} us (collective residual {a.residual_us:.1f} us)"
        for a in align.values()
        if a.matched
    ]
    source = first.source.model_copy(
        update={
            "name": Path(str(path)).name,
            "trace_file": str(path),
            "config": {"ranks": len(datas), "origin_us": origin},
        }
    )
    return Timeline(source=source, spans=spans, notes=tuple(notes))


def analyze(
    trace: Timeline | str | Path,
    *,
    patterns: PatternsArg = None,
    split_half_layers: bool = False,
) -> AnalysisResult:
    """Analyze a measured timeline or a trace path: kernel types, passes, layers, stages, unique kernels.

    A multi-rank path is analyzed rank by rank: the top-level fields describe rank 0 and ``ranks``
    summarizes every rank, with its clock offset from matching collectives.
    """
    # the ranks are not returned, so a timeline's CPU ops and kernel launches (which the analysis does
    # not read) stay out
    return _analyze(trace, patterns, split_half_layers, cpu_ops=False)[0]


def analyze_full(
    trace: Timeline | str | Path,
    *,
    patterns: PatternsArg = None,
    split_half_layers: bool = False,
) -> tuple[AnalysisResult, list[TraceData], list[list[Label]]]:
    """:func:`analyze`, also returning the imported ranks and every device event's (layer, stage, pass)."""
    return _analyze(trace, patterns, split_half_layers, cpu_ops=True)


@_paused
def _analyze(
    trace: Timeline | str | Path, patterns: PatternsArg, split_half_layers: bool, *, cpu_ops: bool
) -> tuple[AnalysisResult, list[TraceData], list[list[Label]]]:
    ps = _patterns(patterns)
    clf = KernelClassifier(ps)
    datas = [from_timeline(trace, cpu_ops=cpu_ops)] if isinstance(trace, Timeline) else collect_all(trace)
    results = []
    labels = []
    for d in datas:
        r, lab = Analyzer(ps, clf).run(d, split_half_layers=split_half_layers)
        results.append(r)
        labels.append(lab)
    main = results[0]
    if len(datas) > 1:
        align = {a.rank: a for a in align_ranks(datas)}
        ranks = tuple(
            RankSummary(
                rank=d.rank or 0,
                file=d.file,
                kernels=r.kernels,
                time_us=r.kernel_time_us,
                offset_us=round(align[d.rank or 0].offset_us, 3),
                residual_us=round(align[d.rank or 0].residual_us, 3),
                collectives=tuple(CollectiveInfo.model_validate(c.model_dump()) for c in r.collectives),
                layers=len(r.layers),
                passes=len(r.passes),
            )
            for d, r in zip(datas, results, strict=True)
        )
        incomplete = [r for r in results if not r.complete]
        main = main.model_copy(
            update={
                "ranks": ranks,
                "complete": not incomplete,
                "source": str(trace),
                "notes": (*main.notes, *(f"rank{r.rank}: incomplete" for r in incomplete)),
            }
        )
    return main, datas, labels
