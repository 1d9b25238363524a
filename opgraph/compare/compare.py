"""Join two timelines and report prediction error per op, kind, layer, stage and end to end.

The *predicted* timeline (usually simulated) is compared with the *reference* (usually measured).
Two joins:

- ``op_id``: both timelines carry op ids of the same graph (a simulation and a
  ``capture --profile`` run); the device time of all kernels attributed to an op is summed.
- ``definition``: kernel-level timelines without shared op ids; spans are keyed by definition (or
  by kernel category when no definition is known) and matched by order of occurrence within a key.

Device time counts only device spans (kernels, memcpy, simulated engine work), not host or CPU
spans; wall time is the timeline's ``wall_us`` when set, else its extent from the first to the last span,
host spans included, in both joins and in the measured-trace join. The group tables (kind, layer,
stage) hold the unmatched time too, so that each side's rows add up to its device time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from opgraph.compare.measured import compare_measured
from opgraph.compare.ranks import pair_ranks
from opgraph.compare.result import MIN_OP_US, CompareError, Comparison, JoinMode, OpError
from opgraph.compare.rows import comparison_of, end_to_end, median
from opgraph.ir import OpGraph, Span, Timeline
from opgraph.ir.timeline import SpanCategory, TimelineKind


def device_spans(timeline: Timeline) -> list[Span]:
    """The spans that are device work (kernels, memcpy, engine work), not host or CPU spans
    (:meth:`opgraph.ir.Timeline.device_spans`)."""
    return timeline.device_spans()


def _category(s: Span) -> str:
    return SpanCategory(s.category).value if s.category is not None else ""


class _Acc:
    __slots__ = ("definition", "dur", "kind", "layer", "op_id", "stage")

    def __init__(self) -> None:
        self.dur = 0.0
        self.op_id: int | None = None
        self.definition = ""
        self.kind = ""
        self.layer: int | None = None
        self.stage = ""

    def add(self, s: Span) -> None:
        self.dur += s.dur_us
        self.op_id = s.op_id if self.op_id is None else self.op_id
        self.definition = self.definition or (s.definition or "")
        self.kind = self.kind or (s.kind.value if s.kind else _category(s))
        self.layer = s.layer if self.layer is None else self.layer
        self.stage = self.stage or (s.stage.value if s.stage else "")


def _by_op_id(spans: Iterable[Span]) -> tuple[dict[str, _Acc], list[Span]]:
    """Spans grouped by op id, and the spans without one."""
    groups: dict[str, _Acc] = {}
    loose: list[Span] = []
    for s in spans:
        if s.op_id is None:
            loose.append(s)
            continue
        groups.setdefault(f"op {s.op_id}", _Acc()).add(s)
    return groups, loose


def _lone(key: str, acc: _Acc, side: str, graph: OpGraph | None) -> OpError:
    """An op (or definition occurrence) of one side only, the other side 0."""
    kind, layer, stage = acc.kind, acc.layer, acc.stage
    op = None
    if graph is not None and acc.op_id is not None:
        try:
            op = graph.op(acc.op_id)
        except KeyError:
            op = None
    if op is not None:
        kind, layer, stage = op.kind.value, op.layer, op.stage.value if op.stage else stage
    return OpError(
        key=f"unmatched {side}: {key}",
        op_id=acc.op_id,
        definition=acc.definition,
        kind=kind,
        layer=layer,
        stage=stage,
        predicted_us=acc.dur if side == "predicted" else 0.0,
        reference_us=acc.dur if side == "reference" else 0.0,
    )


def _without_op(spans: Iterable[Span], side: str) -> list[OpError]:
    """Device spans without an op id, summed by kind (or kernel type), layer and stage, the other side 0."""
    acc: dict[tuple[str, int | None, str], float] = defaultdict(float)
    for s in spans:
        kind = s.kind.value if s.kind else _category(s) or "other"
        acc[(kind, s.layer, s.stage.value if s.stage else "")] += s.dur_us
    return [
        OpError(
            key=f"unmatched {side}: spans without an op ({kind})",
            kind=kind,
            layer=layer,
            stage=stage,
            predicted_us=us if side == "predicted" else 0.0,
            reference_us=us if side == "reference" else 0.0,
        )
        for (kind, layer, stage), us in acc.items()
    ]


def is_cpu_profile(timeline: Timeline) -> bool:
    """A CPU profile (``capture --device cpu --profile``): no device spans, CPU ops attributed to graph ops."""
    return not timeline.device_spans() and any(
        s.op_id is not None and s.category == SpanCategory.CPU_OP for s in timeline.spans
    )


CPU_PROFILE_NOTE = (
    "on the CPU the profiler records aten CPU ops, not kernels: each op's time is the union of the CPU ops it "
    "ran (what `capture --device cpu --profile` records), and the CPU is the device"
)
"""What a CPU profile's time is, as a report says it."""


def cpu_device_view(timeline: Timeline) -> Timeline:
    """A CPU profile as device work: per op, the union of the aten CPU ops attributed to it, one span each.

    The CPU profiler's timeline (``capture --device cpu --profile``) holds nested CPU ops, which no
    report counts as device time; on the CPU they are the work. Each op's intervals are merged so that
    nested calls count once; spans without an op stay out.
    """
    by_op: dict[int, list[Span]] = {}
    for span in timeline.spans:
        if span.op_id is not None:
            by_op.setdefault(span.op_id, []).append(span)
    out: list[Span] = []
    for op_id, spans in by_op.items():
        spans.sort(key=lambda s: s.start_us)
        first = spans[0]
        start, end = first.start_us, first.end_us
        merged: list[tuple[float, float]] = []
        for s in spans[1:]:
            if s.start_us <= end:
                end = max(end, s.end_us)
            else:
                merged.append((start, end))
                start, end = s.start_us, s.end_us
        merged.append((start, end))
        for a, b in merged:
            out.append(first.model_copy(update={
                "name": first.definition or first.name, "track": "cpu", "start_us": a, "dur_us": b - a,
                "category": None, "op_id": op_id, "args": {},
            }))  # fmt: skip
    out.sort(key=lambda s: s.start_us)
    return timeline.model_copy(update={"spans": tuple(out), "notes": (*timeline.notes, CPU_PROFILE_NOTE)})


def no_device_spans(timeline: Timeline, side: str, where: str | None = None) -> CompareError:
    """The error for a ``side`` (predicted or reference) timeline with nothing to compare, saying what to do."""
    label = timeline.source.name or timeline.source.kind.value
    if is_cpu_profile(timeline):
        return CompareError(
            f"the {side} timeline {label!r} is a CPU profile: CPU ops, no device spans",
            where=where,
            hint="compare it with `opgraph compare`, which counts each op's CPU ops as its device time "
            "(as `opgraph validate --device cpu` does)",
        )
    return CompareError(
        f"the {side} timeline {label!r} has no device spans to compare (empty, or host spans only)",
        where=where,
        hint="pass a simulated timeline (`opgraph simulate -o`) or a trace with GPU kernels",
    )


def _by_definition(spans: Iterable[Span]) -> dict[str, _Acc]:
    # Consecutive spans of one op id are one op; otherwise each span is one occurrence of its key.
    seen: dict[str, int] = defaultdict(int)
    groups: dict[str, _Acc] = {}
    last_op: int | None = None
    last_key = ""
    for s in spans:
        base = s.definition or _category(s) or (s.kind.value if s.kind else "") or s.name
        if s.op_id is not None and s.op_id == last_op and last_key.startswith(base + "#"):
            groups[last_key].add(s)
            continue
        key = f"{base}#{seen[base]}"
        seen[base] += 1
        groups.setdefault(key, _Acc()).add(s)
        last_op, last_key = s.op_id, key
    return groups


def check_graph_model(graph: OpGraph, predicted: Timeline, reference: Timeline) -> None:
    """Raise :class:`CompareError` when a timeline's ops are of another model than ``graph`` (its
    ``graph_model``): the graph would join the rows to the wrong model's ops."""
    model = graph.metadata.model
    for side, t in (("predicted", predicted), ("reference", reference)):
        other = t.source.graph_model
        if model and other and other != model:
            raise CompareError(
                f"the {side} timeline's ops are of model {other!r}, the graph is of {model!r}",
                where="--graph",
                hint="give the graph the timelines come from, leave --graph out, or pass --allow-different-models",
            )


def compare_timelines(
    predicted: Timeline,
    reference: Timeline,
    *,
    join: JoinMode = JoinMode.AUTO,
    graph: OpGraph | None = None,
    top: int = 10,
    allow_different_models: bool = False,
    rank: int | None = None,
) -> Comparison:
    """Compare ``predicted`` with ``reference``; raise :class:`CompareError` when nothing can be matched.

    ``graph`` fills in kind, layer and stage for ops whose spans lack them. A simulation against a measured
    trace without op ids (any torch-profiler trace) is joined by steps, layers and aten calls
    (:func:`opgraph.compare.measured.compare_measured`): it never fails for lack of matches, it says how
    much matched. ``rank`` picks the rank to detail when either side has several.
    """
    # A CPU profile's CPU ops are its device work (as ``opgraph validate --device cpu`` counts them).
    predicted, reference = (cpu_device_view(t) if is_cpu_profile(t) else t for t in (predicted, reference))
    for side, t in (("predicted", predicted), ("reference", reference)):
        if not t.device_spans():
            raise no_device_spans(t, side)
    pm, rm = predicted.source.graph_model, reference.source.graph_model
    if pm and rm and pm != rm and not allow_different_models:
        raise CompareError(
            f"the timelines come from different models ({pm!r} vs {rm!r})",
            hint="compare timelines of the same model, or pass --allow-different-models",
        )
    if graph is not None and not allow_different_models:
        check_graph_model(graph, predicted, reference)
    pairs, (detail_rank, predicted_r, reference_r), rank_notes = pair_ranks(predicted, reference, rank)
    pred_dev, ref_dev = device_spans(predicted_r), device_spans(reference_r)
    if join is JoinMode.AUTO:
        pred_ids = {s.op_id for s in pred_dev if s.op_id is not None}
        ref_ids = {s.op_id for s in ref_dev if s.op_id is not None}
        shared = pred_ids & ref_ids
        if shared and len(shared) >= 0.5 * min(len(pred_ids), len(ref_ids)):
            join = JoinMode.OP_ID
        elif reference.source.kind is TimelineKind.MEASURED and not ref_ids and pred_ids:
            join = JoinMode.TRACE
        else:
            join = JoinMode.DEFINITION
    if join is JoinMode.TRACE:
        return compare_measured(predicted, reference, graph=graph, top=top, rank=rank)
    if join is JoinMode.OP_ID:
        pg, p_spans = _by_op_id(pred_dev)
        rg, r_spans = _by_op_id(ref_dev)
    else:
        pg, rg = _by_definition(pred_dev), _by_definition(ref_dev)
        p_spans, r_spans = [], []
    keys = [k for k in rg if k in pg]
    if not keys:
        raise CompareError(
            f"no op matched by {join.value}: {len(pg)} predicted and {len(rg)} reference groups share no key",
            hint="join op-id timelines of the same graph, or kernel timelines that carry definitions",
        )
    errors: list[OpError] = []
    for k in keys:
        p, r = pg[k], rg[k]
        kind, layer, stage = r.kind or p.kind, r.layer if r.layer is not None else p.layer, r.stage or p.stage
        op_id = p.op_id if p.op_id is not None else r.op_id
        if graph is not None and op_id is not None and join is JoinMode.OP_ID:
            try:
                op = graph.op(op_id)
            except KeyError:
                op = None
            if op is not None:
                kind, layer = op.kind.value, op.layer
                stage = op.stage.value if op.stage else stage
        errors.append(
            OpError(
                key=k,
                op_id=op_id,
                definition=p.definition or r.definition,
                kind=kind,
                layer=layer,
                stage=stage,
                predicted_us=p.dur,
                reference_us=r.dur,
            )
        )
    unmatched_p = [k for k in pg if k not in rg]
    unmatched_r = [k for k in rg if k not in pg]
    lone = [_lone(k, pg[k], "predicted", graph if join is JoinMode.OP_ID else None) for k in unmatched_p]
    lone += [_lone(k, rg[k], "reference", graph if join is JoinMode.OP_ID else None) for k in unmatched_r]
    lone += _without_op(p_spans, "predicted") + _without_op(r_spans, "reference")
    big = [abs(e.rel_error) for e in errors if e.reference_us >= MIN_OP_US]
    end = []
    if len(pairs) > 1:
        for r_i, pv, rv in pairs:
            r_dev = sum(s.dur_us for s in device_spans(rv))
            end += end_to_end(pv, r_dev, rv, suffix=f" rank{r_i}")
    return comparison_of(
        predicted,
        reference,
        errors,
        top=top,
        unmatched=lone,
        join=join,
        unmatched_predicted=len(unmatched_p) + len(p_spans),
        unmatched_reference=len(unmatched_r) + len(r_spans),
        unmatched_predicted_us=sum(pg[k].dur for k in unmatched_p) + sum(s.dur_us for s in p_spans),
        unmatched_reference_us=sum(rg[k].dur for k in unmatched_r) + sum(s.dur_us for s in r_spans),
        end_to_end=tuple(end_to_end(predicted_r, sum(s.dur_us for s in ref_dev), reference_r) + end),
        median_abs_rel_error=median(big),
        rank=detail_rank,
        notes=tuple(rank_notes),
    )


def _metric_label(metric: str) -> str:
    """An end-to-end metric as shown: what wall time spans (the same on both sides, in every join)."""
    return metric.replace("wall_time", "wall_time (host and device)", 1) if metric.startswith("wall_time") else metric


def comparison_tables(c: Comparison) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison as titled tables ``(title, columns, rows)`` of strings, for terminals and reports."""

    def pct(x: float) -> str:
        return "n/a" if not math.isfinite(x) else f"{x * 100:+.1f}%"

    def us(x: float) -> str:
        return f"{x:,.1f}"

    tables: list[tuple[str, list[str], list[list[str]]]] = []
    tables.append(
        (
            f"End to end: {c.predicted} vs {c.reference}",
            ["metric", "predicted us", "reference us", "error"],
            [[_metric_label(r.metric), us(r.predicted_us), us(r.reference_us), pct(r.rel_error)] for r in c.end_to_end]
            + [
                [
                    f"median |op error| (ops >= {MIN_OP_US:g} us)",
                    "",
                    "",
                    "n/a" if c.median_abs_rel_error is None else f"{c.median_abs_rel_error * 100:.1f}%",
                ],
                [
                    "matched / unmatched (pred, ref)",
                    str(c.matched),
                    f"{c.unmatched_predicted}, {c.unmatched_reference}",
                    "",
                ],
            ],
        )
    )
    if c.matched_share is not None:
        tables[0][2].append(
            [
                f"reference device time matched ({c.level or c.join.value} level)",
                "",
                "",
                f"{c.matched_share * 100:.1f}%",
            ]
        )
    if c.by_step:
        tables.append(
            (
                "By step (simulated step vs the trace pass of the same stage and order)",
                [
                    "step",
                    "stage",
                    "trace pass",
                    "predicted us",
                    "reference us",
                    "error",
                    "predicted wall (device)",
                    "ref wall (device)",
                ],
                [
                    [
                        str(s.step),
                        s.stage,
                        "-" if s.pass_index is None else str(s.pass_index),
                        us(s.predicted_us),
                        us(s.reference_us),
                        pct(s.rel_error),
                        us(s.predicted_wall_us),
                        us(s.reference_wall_us),
                    ]
                    for s in c.by_step
                ],
            )
        )
    for title, groups in (("By kind", c.by_kind), ("By stage", c.by_stage), ("By layer", c.by_layer)):
        if groups and not (len(groups) == 1 and groups[0].group == "-"):
            columns = ["group", "ops", "predicted us", "reference us", "error"]
            rows = [[g.group, str(g.ops), us(g.predicted_us), us(g.reference_us), pct(g.rel_error)] for g in groups]
            if any(g.unmatched_predicted_us or g.unmatched_reference_us for g in groups):
                # the rows hold the unmatched time too (so they add up): say how much of each side it is
                columns.append("unmatched us (pred, ref)")
                for row, g in zip(rows, groups, strict=True):
                    row.append(f"{us(g.unmatched_predicted_us)}, {us(g.unmatched_reference_us)}")
            tables.append((title, columns, rows))
    if c.notes:
        tables.append(("Notes", ["note"], [[n] for n in c.notes]))
    tables.append(
        (
            "Ops that explain most of the gap",
            ["op", "definition", "kind", "predicted us", "reference us", "gap us", "error"],
            [
                [e.key, e.definition, e.kind, us(e.predicted_us), us(e.reference_us), us(e.error_us), pct(e.rel_error)]
                for e in c.top_gaps
            ],
        )
    )
    return tables
