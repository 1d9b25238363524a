"""Compare a simulation with a measured trace that opgraph did not make (any Kineto trace).

The trace carries no op ids, so spans are aligned the way the trace allows:

- **steps**: the simulation's forward passes (``Span.step``) are matched to the trace's passes by stage
  and order (the first prefill with the first prefill, the k-th decode with the k-th decode); a step
  left over takes a pass of unknown stage, then a mixed one, and a note says so;
- **layers**: within matched steps, model layer ``l`` of the simulation with the ``l``-th layer the
  analyzer found in the pass; what lies outside every layer on both sides (embedding, LM head,
  sampling) is a bucket of its own;
- **ops** (traces with CPU ops, and a graph): each graph op is given the kernels of its module range and
  aten call where the trace marks module calls (:mod:`opgraph.compare.modules`), else within a layer
  bucket by call order, name and input shapes, fused ops with every call they were fused from
  (:mod:`opgraph.compare.align`); an alignment that gives ops kernels of other kinds, or one layer far
  more than its share, is not used (:mod:`opgraph.compare.attribution`).

What finds no partner on either side is kept, by step, layer and kind, in the group tables, so that each
side's rows add up to its device time. Multi-rank: rank ``r`` of a ``--tp N`` simulation is compared with
rank ``r`` of the trace; ranks are never summed against one. The end-to-end table (device time, wall) is
always given, with the share of the trace's device time that matched.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from opgraph.compare.align import Bucket, kind_of
from opgraph.compare.attribution import attribute_ops
from opgraph.compare.ranks import pair_ranks
from opgraph.compare.result import MIN_OP_US, Comparison, ErrorRow, JoinMode, OpError, StepError, _rel
from opgraph.compare.rows import comparison_of, end_to_end, error_row, median
from opgraph.ir import OpGraph, Span, Timeline
from opgraph.trace.analysis import Analyzer
from opgraph.trace.classify import KernelClassifier
from opgraph.trace.events import GpuEvent, TraceData
from opgraph.trace.importer import from_timeline
from opgraph.trace.patterns import load_patterns
from opgraph.trace.result import AnalysisResult

_ONE_SIDED_WHY = {
    "rope": "an eager RoPE runs as mul, neg, cat and add kernels, which the trace types as elementwise and "
    "memory: pass the graph (--graph) with a trace recorded with shapes to align them with the rope ops",
}
"""Why a kind found on one side only may be on the other side under another name."""


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


_OTHER_STAGE = {"mixed": "prefill and decode requests batched in one step", "unknown": "stage not recognised"}


def step_notes(matches: Sequence[StepMatch], measured: AnalysisResult) -> list[str]:
    """Notes on steps matched to a pass of another stage (a decode step against a mixed pass), on steps
    left without a pass and on passes left without a step."""
    notes: list[str] = []
    other: dict[tuple[str, str], list[StepMatch]] = defaultdict(list)
    for m in matches:
        if m.pass_index is not None and measured.passes[m.pass_index].stage != m.stage:
            other[(m.stage, measured.passes[m.pass_index].stage)].append(m)
    for (stage, pass_stage), ms in other.items():
        why = _OTHER_STAGE.get(pass_stage, pass_stage)
        notes.append(
            f"simulated {stage} step(s) {[m.step for m in ms]} compared with the trace's {pass_stage} pass(es) "
            f"{[m.pass_index for m in ms]} ({why}): the trace has no {stage} pass left for them, so all of "
            f"the pass is their reference"
        )
    lost = [m.step for m in matches if m.pass_index is None]
    if lost:
        notes.append(f"simulated step(s) {lost} have no trace pass of their stage left to match")
    extra = len(measured.passes) - sum(1 for m in matches if m.pass_index is not None)
    if extra > 0:
        notes.append(f"{extra} trace pass(es) matched no simulated step (their time is unmatched reference time)")
    return notes


Orphan = tuple[GpuEvent, str, int | None]
"""A device event of the trace's own work in no matched pass: the event, its pass's stage, its layer."""


def buckets(
    matches: Sequence[StepMatch], graph: OpGraph | None, measured: MeasuredRank, pred_ops: set[int] | None
) -> tuple[dict[tuple[int, int | None], Bucket], list[Orphan]]:
    """(step, layer) buckets of matched steps: graph ops (when a graph is given) and measured device events;
    and the trace's own device events in no matched pass."""
    out: dict[tuple[int, int | None], Bucket] = {}
    orphans: list[Orphan] = []
    pass_to_step = {m.pass_index: m for m in matches if m.pass_index is not None}
    first_layer: dict[int, int] = {}
    for info in measured.analysis.layers:
        first_layer.setdefault(info.pass_index, info.index)
    for j, g in enumerate(measured.data.gpu):
        if j < measured.skip:
            continue
        layer, _, pi = measured.labels[j]
        local = None if layer is None or pi is None else layer - first_layer.get(pi, 0)
        m = pass_to_step.get(pi) if pi is not None else None
        if m is None:
            orphans.append((g, measured.analysis.passes[pi].stage if pi is not None else "", local))
            continue
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
    return out, orphans


def _family(s: Span) -> str:
    """A simulated span's kind at the granularity of measured kernel types: every MoE part (routing,
    dispatch, expert GEMMs, combine) is ``moe``, as a trace's MoE kernels are."""
    kind = s.kind.value if s.kind else "other"
    if kind.startswith("moe") or any(w in (s.definition or "") for w in ("moe", "expert")):
        return "moe"
    return kind


@dataclass
class Unmatched:
    """Device time of either side with no partner, summed by (side, step, layer, stage, kind)."""

    time_us: dict[tuple[str, int | None, int | None, str, str], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    items: dict[str, set[Hashable]] = field(default_factory=lambda: {"predicted": set(), "reference": set()})
    """What went unmatched on each side (ops, spans, kernels or kernel groups), for the counts."""

    def add(
        self, side: str, item: Hashable, step: int | None, layer: int | None, stage: str, kind: str, us: float
    ) -> None:
        """``us`` of ``side`` (``predicted`` or ``reference``) found no partner; ``item`` is what it was."""
        self.time_us[(side, step, layer, stage, kind)] += us
        self.items[side].add(item)

    def count(self, side: str) -> int:
        """Ops, spans, kernels or kernel groups of ``side`` with no partner."""
        return len(self.items[side])

    def us(self, side: str) -> float:
        """Device time of ``side`` with no partner."""
        return sum(v for k, v in self.time_us.items() if k[0] == side)

    def entries(self) -> list[OpError]:
        """The unmatched time as entries with the other side 0, for the group tables."""
        out = []
        for (side, step, layer, stage, kind), us in self.time_us.items():
            when = "no step" if step is None else f"step {step}"
            pred, ref = (us, 0.0) if side == "predicted" else (0.0, us)
            out.append(group_error(f"unmatched {side}: {when}", step, layer, stage, kind, pred, ref))
        return out


def group_error(
    label: str, step: int | None, layer: int | None, stage: str, kind: str, predicted_us: float, reference_us: float
) -> OpError:
    """The entry of one (step, layer, kind) group, keyed ``LABEL layer N KIND`` (``outside layers``)."""
    where = "outside layers" if layer is None else f"layer {layer}"
    return OpError(
        key=f"{label} {where} {kind}",
        kind=kind,
        layer=layer,
        stage=stage,
        step=step,
        predicted_us=predicted_us,
        reference_us=reference_us,
    )


@dataclass
class PairResult:
    """What one rank pair's join found."""

    errors: list[OpError]
    """Matched ops or (step, layer, kind) groups."""
    unmatched: Unmatched
    matches: list[StepMatch]
    matched_ref_us: float
    level: str
    notes: list[str]
    measured: MeasuredRank


def _pair(pred: Timeline, ref: Timeline, graph: OpGraph | None) -> PairResult:
    """Join one rank pair: per op (aten calls aligned) when the graph and the trace's CPU ops allow, else per
    step, layer and kind; every device microsecond of either side is matched or unmatched."""
    notes: list[str] = []
    pred_dev = pred.device_spans()
    measured = MeasuredRank.of(ref)
    matches = match_steps(sim_steps(pred_dev), measured.analysis)
    notes += step_notes(matches, measured.analysis)
    pred_by_op: dict[int, float] = defaultdict(float)
    for s in pred_dev:
        if s.op_id is not None:
            pred_by_op[s.op_id] += s.dur_us
    stage_of = {m.step: m.stage for m in matches}

    def stage(s: Span) -> str:
        return s.stage.value if s.stage else stage_of.get(s.step or 0, "")

    linked = any(g.launch_host is not None for g in measured.data.gpu)
    groups, orphans = buckets(matches, graph, measured, set(pred_by_op) if graph is not None else None)
    lone = Unmatched()
    for g, pass_stage, layer in orphans:
        lone.add("reference", id(g), None, layer, pass_stage, kind_of(g), g.dur)
    errors: list[OpError] = []
    matched_ref = 0.0
    level = "layer"
    if graph is not None and linked:
        chosen = attribute_ops(list(groups.values()), measured.data, pred_by_op)
        notes += chosen.notes
        if chosen.owners is not None:
            level = "op"
            owners = chosen.owners
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
            owned = {id(g) for ks in owners.values() for g in ks}
            for b in groups.values():
                for g in b.kernels:
                    if id(g) not in owned:
                        lone.add("reference", id(g), b.step, b.layer, b.stage, kind_of(g), g.dur)
            for s in pred_dev:
                if s.op_id is None or s.op_id not in owners:
                    kind = s.kind.value if s.kind else "other"
                    item = ("op", s.op_id) if s.op_id is not None else ("span", id(s))
                    lone.add("predicted", item, s.step or 0, s.layer, stage(s), kind, s.dur_us)
    elif graph is None and linked:
        notes.append("pass the graph (--graph) to align the trace's aten calls with its ops")
    elif not linked:
        notes.append("the trace has no CPU ops linked to kernels: compared by step, layer and kind")
    if level == "layer":
        pred_units: dict[tuple[int, int | None, str], float] = defaultdict(float)
        for s in pred_dev:
            pred_units[(s.step or 0, s.layer, _family(s))] += s.dur_us
        ref_units: dict[tuple[int, int | None, str], float] = defaultdict(float)
        for b in groups.values():
            for g in b.kernels:
                ref_units[(b.step, b.layer, kind_of(g))] += g.dur
        for key in sorted(set(pred_units) | set(ref_units), key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2])):
            step, layer, kind = key
            if key in pred_units and key in ref_units:
                when = stage_of.get(step, "")
                errors.append(group_error(f"step {step}", step, layer, when, kind, pred_units[key], ref_units[key]))
                matched_ref += ref_units[key]
            elif key in pred_units:
                lone.add("predicted", key, step, layer, stage_of.get(step, ""), kind, pred_units[key])
            else:
                lone.add("reference", key, step, layer, stage_of.get(step, ""), kind, ref_units[key])
    return PairResult(errors, lone, matches, matched_ref, level, notes, measured)


def one_sided_kinds(c: Comparison) -> list[str]:
    """Notes on kinds with time on one side only (a row whose error is n/a), and why when it is known."""
    notes = []
    for side in ("predicted", "reference"):
        lone = [
            g
            for g in c.by_kind
            if g.ops == 0
            and (g.predicted_us if side == "predicted" else g.reference_us) > 0
            and (g.reference_us if side == "predicted" else g.predicted_us) == 0
        ]
        if not lone:
            continue
        shown = ", ".join(
            f"{g.group} ({g.predicted_us if side == 'predicted' else g.reference_us:,.1f} us)" for g in lone
        )
        only, other = ("the prediction", "reference") if side == "predicted" else ("the reference", "prediction")
        notes.append(f"kinds only {only} has (none of their time matched in the {other}): {shown}")
        notes += [f"{g.group}: {_ONE_SIDED_WHY[g.group]}" for g in lone if g.group in _ONE_SIDED_WHY]
    return notes


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
    layer and kind. ``matched_share`` says how much of the trace's device time found a partner; what found
    none is in the group tables too (``unmatched_*_us``), so that each side's rows add up to its device time.
    """
    pairs, (detail_rank, pv, rv), notes = pair_ranks(predicted, reference, rank)
    end: list[ErrorRow] = []
    if len(pairs) > 1:
        for r_i, p_i, r_v in pairs:
            end += end_to_end(p_i, MeasuredRank.of(r_v).device_us, r_v, suffix=f" rank{r_i}")
    res = _pair(pv, rv, graph)
    measured = res.measured
    notes += res.notes
    notes += [f"trace: {n}" for n in measured.analysis.notes if "python_function" not in n]
    head = end_to_end(pv, measured.device_us, rv)
    if measured.skip and rv.wall_us is None:
        early = sum(g.dur for g in measured.data.gpu[: measured.skip])
        notes.append(
            f"wall_time spans the whole trace, host spans included: it holds the {measured.skip} device events "
            f"({early / 1000:,.3f} ms) at its start that ran an earlier step's work, which gpu_time leaves out"
        )
    matched = [m for m in res.matches if m.pass_index is not None]
    if len(matched) < len(measured.analysis.passes) or len(matched) < len(res.matches):
        p_us = sum(m.predicted_us for m in matched)
        r_us = sum(m.reference_us for m in matched)
        head.append(error_row("gpu_time (matched steps)", p_us, r_us))
    share = res.matched_ref_us / measured.device_us if measured.device_us else 0.0
    if share < 0.5:
        notes.append(f"only {100 * share:.0f}% of the trace's device time matched: read the end-to-end rows")
    big = [abs(e.rel_error) for e in res.errors if e.reference_us >= MIN_OP_US and math.isfinite(e.rel_error)]
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
        for m in res.matches
    )
    c = comparison_of(
        predicted,
        reference,
        res.errors,
        top=top,
        unmatched=res.unmatched.entries(),
        join=JoinMode.TRACE,
        unmatched_predicted=res.unmatched.count("predicted"),
        unmatched_reference=res.unmatched.count("reference"),
        unmatched_predicted_us=res.unmatched.us("predicted"),
        unmatched_reference_us=res.unmatched.us("reference"),
        end_to_end=tuple(head + end),
        median_abs_rel_error=median(big),
        by_step=steps,
        level=res.level,
        matched_share=share,
        rank=detail_rank,
        notes=tuple(notes),
    )
    return c.model_copy(update={"notes": (*c.notes, *one_sided_kinds(c))})
