"""Compare a simulation with a measured trace that opgraph did not make (any Kineto trace).

The trace carries no op ids, so spans are aligned the way the trace allows:

- **steps**: the simulation's forward passes (``Span.step``) are matched to the trace's passes by stage
  and order (the first prefill with the first prefill, the k-th decode with the k-th decode);
- **layers**: within matched steps, model layer ``l`` of the simulation with the ``l``-th layer the
  analyzer found in the pass; what lies outside every layer on both sides (embedding, LM head,
  sampling) is a bucket of its own;
- **ops** (traces with CPU ops, and a graph): within a layer bucket, each graph op lowered from an aten
  call is aligned with the trace's call of that op by call order, name and input shapes; the kernels
  launched under that call are the op's. Fused graph ops (an RMSNorm module, RoPE) take the unaligned
  kernels between their aligned neighbours.

Multi-rank: rank ``r`` of a ``--tp N`` simulation is compared with rank ``r`` of the trace; ranks are
never summed against one. The end-to-end table (device time, wall) is always given, with the share
of the trace's device time that matched.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opgraph.compare.result import (
    MIN_OP_US,
    CompareError,
    Comparison,
    ErrorRow,
    JoinMode,
    OpError,
    StepError,
    _group,
    _rel,
)
from opgraph.ir import OpGraph, Span, Timeline
from opgraph.ir.ops import OpBase
from opgraph.trace.analysis import Analyzer
from opgraph.trace.classify import KernelClassifier
from opgraph.trace.events import GpuEvent, HostEvent, TraceData
from opgraph.trace.importer import from_timeline
from opgraph.trace.patterns import load_patterns
from opgraph.trace.result import AnalysisResult

_KIND_OF_TYPE = {
    "attention": "attention",
    "gemm": "gemm",
    "moe": "moe",
    "norm": "norm",
    "activation": "activation",
    "rope": "rope",
    "elementwise": "elementwise",
    "reduction": "elementwise",
    "memory": "memory",
    "communication": "collective",
    "sampling": "topk",
    "embedding": "embedding",
    "quantization": "elementwise",
    "other": "other",
    "unknown": "other",
}
"""Kernel type of a measured kernel -> op kind of the graph (coarser where the graph has no such kind)."""
_BY_CALL = 0.5
"""Share of the graph's aten-call ops that must find their call in the trace for an op-level comparison;
below it the trace is compared by step, layer and kind."""
_SEARCH = 48
"""Kernels searched ahead for an op's call of the same input shapes."""
_NEAR = 6
"""Kernels searched ahead for a call of the same name whose shapes differ (a composite op's recorded
inputs are not its first aten call's)."""


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


@dataclass
class MeasuredRank:
    """One rank of a measured trace, imported, linked and analyzed."""

    data: TraceData
    analysis: AnalysisResult
    labels: list[tuple[int | None, str | None, int | None]]
    """(global layer, stage, pass) of every device event."""
    skip: int
    """Leading device events launched before the profiler window (in no pass)."""

    @classmethod
    def of(cls, timeline: Timeline) -> MeasuredRank:
        """Import a single-rank measured timeline (its host spans give the launch links)."""
        data = from_timeline(timeline, link=True)
        ps = load_patterns()
        analysis, labels = Analyzer(ps, KernelClassifier(ps)).run(data)
        return cls(data, analysis, labels, analysis.window_events)

    @property
    def device_us(self) -> float:
        """Device time of the trace's own work (events launched before the window left out)."""
        return sum(g.dur for g in self.data.gpu[self.skip :])

    @property
    def wall_us(self) -> float:
        """From the first to the last device event of the trace's own work."""
        own = self.data.gpu[self.skip :]
        if not own:
            return 0.0
        return max(g.ts + g.dur for g in own) - min(g.ts for g in own)


@dataclass
class StepMatch:
    """A simulated step and the trace pass it is compared with."""

    step: int
    stage: str
    pass_index: int | None
    predicted_us: float
    predicted_wall_us: float
    reference_us: float = 0.0
    reference_wall_us: float = 0.0


@dataclass
class Bucket:
    """Graph ops and measured kernels of one (step, layer) of one rank; ``layer`` None is outside layers."""

    step: int
    layer: int | None
    stage: str
    ops: list[OpBase] = field(default_factory=list)
    kernels: list[GpuEvent] = field(default_factory=list)


def sim_steps(spans: Sequence[Span]) -> dict[int, tuple[str, float, float]]:
    """Per simulated step: (stage, device time, wall extent of its device spans)."""
    acc: dict[int, list[float]] = {}
    stages: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        step = s.step or 0
        row = acc.setdefault(step, [0.0, math.inf, -math.inf])
        row[0] += s.dur_us
        row[1] = min(row[1], s.start_us)
        row[2] = max(row[2], s.start_us + s.dur_us)
        stages[step][s.stage.value if s.stage else "unknown"] += s.dur_us
    return {k: (max(stages[k].items(), key=lambda kv: kv[1])[0], v[0], v[2] - v[1]) for k, v in sorted(acc.items())}


def match_steps(sim: dict[int, tuple[str, float, float]], measured: AnalysisResult) -> list[StepMatch]:
    """Simulated steps matched to the trace's passes by stage and order; passes of unknown stage, then mixed
    passes (prefill and decode in one step), are taken in order by the steps left over."""
    by_stage: dict[str, list[int]] = defaultdict(list)
    for p in measured.passes:
        by_stage[p.stage].append(p.index)
    used: set[int] = set()
    out: list[StepMatch] = []
    for step, (stage, dev, wall) in sim.items():
        pool = by_stage.get(stage, [])
        pick = next((i for i in pool if i not in used), None)
        for fallback in ("unknown", "mixed"):  # a mixed step holds prefill and decode work
            if pick is None:
                pick = next((i for i in by_stage.get(fallback, []) if i not in used), None)
        m = StepMatch(step, stage, pick, dev, wall)
        if pick is not None:
            used.add(pick)
            p = measured.passes[pick]
            m.reference_us = p.time_us
            m.reference_wall_us = p.end_us - p.start_us
        out.append(m)
    return out


def buckets(
    matches: Sequence[StepMatch], graph: OpGraph | None, measured: MeasuredRank, pred_ops: set[int] | None
) -> dict[tuple[int, int | None], Bucket]:
    """(step, layer) buckets of matched steps: graph ops (when a graph is given) and measured device events."""
    out: dict[tuple[int, int | None], Bucket] = {}
    pass_to_step = {m.pass_index: m for m in matches if m.pass_index is not None}
    first_layer: dict[int, int] = {}
    for info in measured.analysis.layers:
        first_layer.setdefault(info.pass_index, info.index)
    for j, g in enumerate(measured.data.gpu):
        if j < measured.skip:
            continue
        layer, _, pi = measured.labels[j]
        m = pass_to_step.get(pi) if pi is not None else None
        if m is None or pi is None:
            continue
        local = None if layer is None else layer - first_layer.get(pi or 0, 0)
        key = (m.step, local)
        b = out.get(key)
        if b is None:
            b = out[key] = Bucket(m.step, local, m.stage)
        b.kernels.append(g)
    if graph is not None:
        steps = {m.step for m in matches if m.pass_index is not None}
        for op in graph.ops:
            if pred_ops is not None and op.id not in pred_ops:
                continue
            step = op.step or 0
            if step not in steps:
                continue
            key = (step, op.layer)
            b = out.get(key)
            if b is None:
                b = out[key] = Bucket(step, op.layer, op.stage.value if op.stage else "unknown")
            b.ops.append(op)
    return out


def _aten_name(op: OpBase) -> str | None:
    t = op.target
    if not t.startswith("aten."):
        return None
    return t.split(".")[1]


def _op_name(h: HostEvent) -> str:
    return h.name.rsplit("::", 1)[-1]


def _dims_key(dims: object) -> tuple[tuple[int, ...], ...] | None:
    """Non-empty tensor shapes of an op's inputs, in order (empty tensors and scalars left out)."""
    if not isinstance(dims, (list, tuple)):
        return None
    out = []
    for d in dims:
        if isinstance(d, (list, tuple)) and d and all(isinstance(x, int) for x in d) and 0 not in d:
            out.append(tuple(int(x) for x in d))
    return tuple(out)


def _graph_key(op: OpBase) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t.shape) for t in op.inputs if t.shape and 0 not in t.shape)


def _chain(g: GpuEvent) -> list[HostEvent]:
    out = []
    h = g.launch_host
    while h is not None:
        out.append(h)
        h = h.parent
    return out


def align_ops(bucket: Bucket) -> tuple[dict[int, list[GpuEvent]], set[int]]:
    """Measured device events of each graph op of a bucket (op id -> events), by call order, name and shapes,
    and the ids of the ops aligned with a call of their own (the others took kernels between neighbours)."""
    kernels = bucket.kernels
    chains = [_chain(g) for g in kernels]
    consumed = [False] * len(kernels)
    used_calls: set[int] = set()
    owner: dict[int, list[int]] = {}
    pos = 0
    matched_at: list[tuple[int, int, int]] = []  # (graph order, first kernel, last kernel)

    def find(name: str, key: tuple[tuple[int, ...], ...] | None) -> HostEvent | None:
        reach = _SEARCH if key else _NEAR  # no input tensors to compare: only a near call of that name
        for k in range(pos, min(pos + reach, len(kernels))):
            if consumed[k]:
                continue
            for h in chains[k]:
                if id(h) in used_calls or _op_name(h) != name:
                    continue
                if key is None or _dims_key(h.input_dims) == key:
                    return h
        return None

    for order, op in enumerate(bucket.ops):
        name = _aten_name(op)
        if name is None:
            continue
        call = find(name, _graph_key(op)) or find(name, None)
        if call is None:
            continue
        used_calls.add(id(call))
        idx = [k for k in range(pos, len(kernels)) if not consumed[k] and any(h is call for h in chains[k])]
        if not idx:
            continue
        for k in idx:
            consumed[k] = True
        owner[op.id] = idx
        matched_at.append((order, idx[0], idx[-1]))
        pos = idx[0]
    called = set(owner)
    # fused ops (modules, or ops with no recorded call) take the unaligned kernels between aligned neighbours
    bounds = [(-1, -1, -1), *matched_at, (len(bucket.ops), len(kernels), len(kernels))]
    for (o1, _, last1), (o2, first2, _) in itertools.pairwise(bounds):
        between = [op for op in bucket.ops[o1 + 1 : o2] if op.id not in owner]
        fused = [op for op in between if _aten_name(op) is None or op.call is None]
        left = [k for k in range(last1 + 1, first2) if not consumed[k]]
        if not left:
            continue
        takers = fused or ([bucket.ops[o1]] if o1 >= 0 and bucket.ops[o1].call is None else [])
        if not takers:
            continue
        for op, part in zip(takers, _segment(takers, [kernels[k] for k in left]), strict=True):
            idx = [left[i] for i in part]
            if idx:
                owner.setdefault(op.id, []).extend(idx)
                for k in idx:
                    consumed[k] = True
    return {op_id: [kernels[k] for k in idx] for op_id, idx in owner.items()}, called


def _work_kind(g: GpuEvent) -> str:
    """What a kernel computes, for handing it to one of several fused ops: GEMMs by their launching op."""
    if any(op.endswith("mm") for op in g.launch_stack):
        return "gemm"
    kind = kind_of(g)
    return "moe_routing" if kind == "moe" else kind


def _segment(takers: Sequence[OpBase], kernels: Sequence[GpuEvent]) -> list[list[int]]:
    """Split kernels (in time order) among fused ops (in graph order) without reordering, on GEMMs: a GEMM
    kernel (by its launching op) moves on to the next GEMM op, the first other kernel after it to the op
    after that (MoE: router, expert GEMM, activation, expert GEMM, combine). Without GEMMs to go by, the
    kernels are shared out evenly."""
    parts: list[list[int]] = [[] for _ in takers]
    gemm = [op.kind.value == "gemm" for op in takers]
    t = 0
    guided = False
    for i, g in enumerate(kernels):
        is_gemm = _work_kind(g) == "gemm"
        if is_gemm and not gemm[t]:
            nxt = next((j for j in range(t + 1, len(takers)) if gemm[j]), None)
            if nxt is not None:
                t, guided = nxt, True
        elif not is_gemm and gemm[t] and t + 1 < len(takers) and not gemm[t + 1]:
            t += 1
        parts[t].append(i)
    if not guided and len(takers) > 1:
        share = max(1, math.ceil(len(kernels) / len(takers)))
        parts = [list(range(i * share, min((i + 1) * share, len(kernels)))) for i in range(len(takers))]
    return parts


def _family(s: Span) -> str:
    """A simulated span's kind at the granularity of measured kernel types: every MoE part (routing,
    dispatch, expert GEMMs, combine) is ``moe``, as a trace's MoE kernels are."""
    kind = s.kind.value if s.kind else "other"
    if kind.startswith("moe") or any(w in (s.definition or "") for w in ("moe", "expert")):
        return "moe"
    return kind


def kind_of(g: GpuEvent) -> str:
    """The graph op kind of a measured device event."""
    if g.kind != "kernel":
        return "memory"
    return _KIND_OF_TYPE.get(g.ktype.value, "other")


def median(values: Sequence[float]) -> float | None:
    """Median, or None for no values."""
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- rows of both joins (compare.py too)
def wall_us(timeline: Timeline) -> float:
    """The wall time of ``timeline``: its ``wall_us`` when set, else its extent."""
    return timeline.wall_us if timeline.wall_us is not None else timeline.makespan_us


def error_row(metric: str, predicted_us: float, reference_us: float) -> ErrorRow:
    """The end-to-end row ``metric``: predicted against reference, with the relative error."""
    return ErrorRow(
        metric=metric, predicted_us=predicted_us, reference_us=reference_us, rel_error=_rel(predicted_us, reference_us)
    )


def end_to_end(
    predicted: Timeline, reference_device_us: float, reference_wall_us: float, suffix: str = ""
) -> list[ErrorRow]:
    """The ``gpu_time`` and ``wall_time`` rows of ``predicted`` against the reference's (``suffix``: `` rank1``)."""
    device_us = sum(s.dur_us for s in predicted.device_spans())
    return [
        error_row(f"gpu_time{suffix}", device_us, reference_device_us),
        error_row(f"wall_time{suffix}", wall_us(predicted), reference_wall_us),
    ]


def comparison_of(
    predicted: Timeline, reference: Timeline, errors: Sequence[OpError], *, top: int, **fields: Any
) -> Comparison:
    """The :class:`Comparison` of the matched ``errors``: the labels, the groups by kind, layer and stage,
    the ``top`` largest gaps and every op; ``fields`` are the join's own (end to end, unmatched, median)."""
    return Comparison(
        predicted=predicted.source.name or predicted.source.kind.value,
        reference=reference.source.name or reference.source.kind.value,
        matched=len(errors),
        by_kind=_group(errors, "kind"),
        by_layer=_group(errors, "layer"),
        by_stage=_group(errors, "stage"),
        top_gaps=tuple(sorted(errors, key=lambda e: -abs(e.error_us))[:top]),
        ops=tuple(errors),
        **fields,
    )


def _pair(
    pred: Timeline, ref: Timeline, graph: OpGraph | None
) -> tuple[list[OpError], list[StepMatch], float, float, float, str, list[str], MeasuredRank]:
    """Entries, step matches, matched/unmatched reference time, unmatched predicted time, level and notes of
    one rank pair."""
    notes: list[str] = []
    pred_dev = pred.device_spans()
    measured = MeasuredRank.of(ref)
    matches = match_steps(sim_steps(pred_dev), measured.analysis)
    lost = [m.step for m in matches if m.pass_index is None]
    if lost:
        notes.append(f"simulated step(s) {lost} have no trace pass of their stage left to match")
    extra = len(measured.analysis.passes) - sum(1 for m in matches if m.pass_index is not None)
    if extra > 0:
        notes.append(f"{extra} trace pass(es) matched no simulated step (not in the tables below the end-to-end rows)")
    matched_steps = {m.step for m in matches if m.pass_index is not None}
    pred_by_op: dict[int, float] = defaultdict(float)
    pred_units: dict[tuple[int, int | None, str], float] = defaultdict(float)
    for s in pred_dev:
        if s.op_id is not None:
            pred_by_op[s.op_id] += s.dur_us
        pred_units[(s.step or 0, s.layer, _family(s))] += s.dur_us
    stage_of = {m.step: m.stage for m in matches}
    linked = any(g.launch_host is not None for g in measured.data.gpu)
    groups = buckets(matches, graph, measured, set(pred_by_op) if graph is not None else None)
    errors: list[OpError] = []
    matched_ref = 0.0
    level = "layer"
    if graph is not None and linked:
        owners: dict[int, list[GpuEvent]] = {}
        called: set[int] = set()
        for b in groups.values():
            got, by_call = align_ops(b)
            owners.update(got)
            called |= by_call
        named = sum(1 for b in groups.values() for op in b.ops if _aten_name(op) is not None)
        if named and len(called) >= _BY_CALL * named:
            level = "op"
            by_id = {op.id: op for b in groups.values() for op in b.ops}
            for op_id in sorted(owners):
                op = by_id[op_id]
                ref_us = sum(g.dur for g in owners[op_id])
                errors.append(
                    OpError(
                        key=f"op {op_id}",
                        op_id=op_id,
                        definition=op.definition,
                        kind=op.kind.value,
                        layer=op.layer,
                        stage=op.stage.value if op.stage else stage_of.get(op.step or 0, ""),
                        step=op.step or 0,
                        predicted_us=pred_by_op.get(op_id, 0.0),
                        reference_us=ref_us,
                    )
                )
                matched_ref += ref_us
            unmatched_pred = sum(v for k, v in pred_by_op.items() if k not in owners)
        else:
            notes.append(
                f"only {len(called)} of {named} graph ops lowered from an aten call found that call in the trace "
                "(kernel-only or CUDA-graph trace?): compared by step, layer and kind"
            )
    elif graph is None and linked:
        notes.append("pass the graph (--graph) to align the trace's aten calls with its ops")
    elif not linked:
        notes.append("the trace has no CPU ops linked to kernels: compared by step, layer and kind")
    if level == "layer":
        ref_units: dict[tuple[int, int | None, str], float] = defaultdict(float)
        for b in groups.values():
            for g in b.kernels:
                ref_units[(b.step, b.layer, kind_of(g))] += g.dur
        unmatched_pred = 0.0
        for key in sorted(set(pred_units) | set(ref_units), key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2])):
            step, layer, kind = key
            if key not in ref_units or key not in pred_units:
                if key in pred_units and step in matched_steps:
                    unmatched_pred += pred_units[key]
                continue
            where = "outside layers" if layer is None else f"layer {layer}"
            errors.append(
                OpError(
                    key=f"step {step} {where} {kind}",
                    kind=kind,
                    layer=layer,
                    stage=stage_of.get(step, ""),
                    step=step,
                    predicted_us=pred_units[key],
                    reference_us=ref_units[key],
                )
            )
            matched_ref += ref_units[key]
        unmatched_pred += sum(v for (st, _, _), v in pred_units.items() if st not in matched_steps)
    unmatched_ref = max(measured.device_us - matched_ref, 0.0)
    return errors, matches, matched_ref, unmatched_ref, unmatched_pred, level, notes, measured


def compare_measured(
    predicted: Timeline,
    reference: Timeline,
    *,
    graph: OpGraph | None = None,
    top: int = 10,
    rank: int | None = None,
) -> Comparison:
    """Compare a simulated (or any op-id) timeline with a measured trace's timeline that has no op ids.

    Always gives end-to-end device time and wall (per rank compared, never ranks summed against one) and
    per-step rows; then per op (aten calls aligned, with a graph and a trace with CPU ops) or per step,
    layer and kind. ``matched_share`` says how much of the trace's device time found a partner.
    """
    pred_ranks, ref_ranks = ranks_of(predicted), ranks_of(reference)
    notes: list[str] = []
    pairs: list[tuple[int | None, Timeline, Timeline]] = []
    if pred_ranks and ref_ranks:
        both = [r for r in pred_ranks if r in ref_ranks]
        if not both:
            raise CompareError(
                f"no rank in common: simulated ranks {pred_ranks}, trace ranks {ref_ranks}",
                hint="simulate with --tp matching the trace's ranks",
            )
        pairs = [(r, rank_view(predicted, r), rank_view(reference, r)) for r in both]
        notes.append(f"ranks {both} compared rank by rank")
    elif pred_ranks:
        pr = rank if rank is not None else pred_ranks[0]
        if pr not in pred_ranks:
            raise CompareError(f"no rank {pr} in the simulation", hint=f"ranks: {pred_ranks}")
        pairs = [(pr, rank_view(predicted, pr), reference)]
        notes.append(f"rank {pr} of the {len(pred_ranks)}-rank simulation against the one-rank trace")
    elif ref_ranks:
        rr = rank if rank is not None else ref_ranks[0]
        if rr not in ref_ranks:
            raise CompareError(f"no rank {rr} in the trace", hint=f"ranks: {ref_ranks}")
        pairs = [(rr, predicted, rank_view(reference, rr))]
        notes.append(f"the one-rank simulation against rank {rr} of the {len(ref_ranks)}-rank trace")
    else:
        pairs = [(None, predicted, reference)]
    detail = next((p for p in pairs if p[0] == rank), pairs[0])
    end: list[ErrorRow] = []
    if len(pairs) > 1:
        for r_i, pv, rv in pairs:
            m = MeasuredRank.of(rv)
            end += end_to_end(pv, m.device_us, m.wall_us, suffix=f" rank{r_i}")
    detail_rank, pv, rv = detail
    errors, matches, matched_ref, unmatched_ref, unmatched_pred, level, more, measured = _pair(pv, rv, graph)
    notes += more
    notes += [f"trace: {n}" for n in measured.analysis.notes if "python_function" not in n]
    head = end_to_end(pv, measured.device_us, measured.wall_us)
    matched = [m for m in matches if m.pass_index is not None]
    if len(matched) < len(measured.analysis.passes) or len(matched) < len(matches):
        p_us = sum(m.predicted_us for m in matched)
        r_us = sum(m.reference_us for m in matched)
        head.append(error_row("gpu_time (matched steps)", p_us, r_us))
    share = matched_ref / measured.device_us if measured.device_us else 0.0
    if share < 0.5:
        notes.append(f"only {100 * share:.0f}% of the trace's device time matched: read the end-to-end rows")
    big = [abs(e.rel_error) for e in errors if e.reference_us >= MIN_OP_US and math.isfinite(e.rel_error)]
    steps = tuple(
        StepError(
            step=m.step,
            stage=m.stage,
            pass_index=m.pass_index,
            predicted_us=m.predicted_us,
            reference_us=m.reference_us,
            predicted_wall_us=m.predicted_wall_us,
            reference_wall_us=m.reference_wall_us,
            rel_error=_rel(m.predicted_us, m.reference_us) if m.pass_index is not None else math.inf,
        )
        for m in matches
    )
    return comparison_of(
        predicted,
        reference,
        errors,
        top=top,
        join=JoinMode.TRACE,
        unmatched_predicted=0,
        unmatched_reference=0,
        unmatched_predicted_us=unmatched_pred,
        unmatched_reference_us=unmatched_ref,
        end_to_end=tuple(head + end),
        median_abs_rel_error=median(big),
        by_step=steps,
        level=level,
        matched_share=share,
        rank=detail_rank,
        notes=tuple(notes),
    )
