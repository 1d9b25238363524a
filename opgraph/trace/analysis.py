"""The kernel analyzer: passes, transformer layers and stages of a measured trace, and its breakdowns.

Passes come from step annotations (vLLM ``execute_...``, SGLang ``step[...]``, ``ProfilerStep#N``), else
from sampling kernels that end each ``generate`` iteration. Within a pass, layers are anchored on
attention blocks: a layer starts at the first layer-start marker (a norm) after the previous layer's
feed-forward part began, so blocks whose norm fires two (or four, with q/k norms) times merge into one
layer, and norms after an all-reduce fall out naturally. Stages come from the annotation, else from
votes of stage-specific kernel names and attention input shapes (query length 1 is decode), then
propagate to undecided layers; passes replaying CUDA graphs with shorter layers than an earlier eager
pass are decode; a last fallback reads a long first pass before short similar ones as prefill.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opgraph.ir.timeline import union_length
from opgraph.trace.classify import EXPERT_NOTE_MARK, KernelClassifier
from opgraph.trace.events import GpuEvent, HostEvent, TraceData
from opgraph.trace.patterns import PatternSet
from opgraph.trace.result import (
    AnalysisResult,
    Bucket,
    CollectiveInfo,
    LayerInfo,
    PassInfo,
    StageTypeRow,
    UniqueKernel,
)
from opgraph.trace.window import window_leftovers, window_note

_FFN_TYPES = frozenset({"activation", "moe"})
_STAGE_ORDER = ("prefill", "decode", "mixed", "idle", "unknown")
# Attention ops whose first input is (batch, heads, seq, head_dim); the others are (batch, seq, heads, head_dim).
_BHSD_OPS = ("scaled_dot_product", "_cudnn_attention", "sdpa")
_BSHD_OPS = ("_flash_attention_forward", "_efficient_attention_forward", "flash_attn")

_OUTLIER = 3.0
"""A pass this many times the median pass of its trace is a prefill."""

Label = tuple[int | None, str | None, int | None]
"""(layer, stage, pass) of one device event."""


@dataclass
class _Step:
    name: str
    start: float
    end: float
    stage: str
    gpu_clock: bool
    tokens: int | None = None


@dataclass
class _Layer:
    lo: int
    hi: int  # exclusive positions in the chunk sequence
    attn_end: int  # position after the attention block
    split: int | None  # first marker after attention (half-layer boundary)
    stage: str = "unknown"
    source: str = "none"
    mla: bool = False
    norms: int = 0


@dataclass
class _Pass:
    events: list[int]
    annotation: str = ""
    stage: str = "unknown"
    source: str = "none"
    tokens: int | None = None
    layers: list[_Layer] = field(default_factory=list)
    part: bool = False
    """One of several passes found inside one step annotation (kept only when it holds layers)."""


def _step_stage(rule_labels: dict[str, str], groups: dict[str, str | None]) -> tuple[str, int | None]:
    label = groups.get("label")
    tokens = groups.get("tokens")
    ntok = int(tokens) if tokens and tokens.isdigit() else None
    if ntok is None:
        parts = [groups.get("context_tokens"), groups.get("generation_tokens")]
        counts = [int(x) for x in parts if x and x.isdigit()]
        ntok = sum(counts) if counts else None
    if label is not None:
        return rule_labels.get(label, rule_labels.get(label.upper(), "unknown")), ntok
    ctx, gen = groups.get("context"), groups.get("generation")
    if ctx is not None and gen is not None:
        c, g = int(ctx), int(gen)
        if c and g:
            return "mixed", ntok
        if c:
            return "prefill", ntok
        if g:
            return "decode", ntok
        return "idle", ntok
    return "unknown", ntok


def find_steps(host: Sequence[HostEvent], patterns: PatternSet) -> list[_Step]:
    """Step annotations: the innermost ones (an SGLang ``step[...]`` inside its ``execute_...``)."""
    found: list[_Step] = []
    for h in host:
        if h.kind not in ("annotation", "gpu_annotation"):
            continue
        for rule in patterns.steps:
            m = rule.regex.search(h.name)
            if m:
                stage, tokens = _step_stage(rule.labels, m.groupdict())
                found.append(_Step(h.name, h.ts, h.ts + h.dur, stage, h.kind == "gpu_annotation", tokens))
                break
    if not found:
        return []
    # prefer one clock: host annotations carry launches; GPU ones are used when only they exist
    host_steps = [s for s in found if not s.gpu_clock]
    steps = host_steps or found
    steps.sort(key=lambda s: (s.start, -s.end))
    inner: list[_Step] = []
    for s in steps:
        contains_other = any(o is not s and o.start >= s.start and o.end <= s.end for o in steps)
        if not contains_other:
            inner.append(s)
    # an outer annotation knows the token counts its inner one may lack
    for s in inner:
        if s.tokens is None:
            for o in steps:
                if o.tokens is not None and o.start <= s.start and o.end >= s.end:
                    s.tokens = o.tokens
                    break
    return inner


def _q_len(ev: GpuEvent) -> int | None:
    op, dims = ev.launch_op, ev.launch_dims
    if not op or not isinstance(dims, list) or not dims or not isinstance(dims[0], list) or len(dims[0]) != 4:
        return None
    q = dims[0]
    if any(k in op for k in _BSHD_OPS):
        v = q[1]
    elif any(k in op for k in _BHSD_OPS):
        v = q[2]
    else:
        return None
    return v if isinstance(v, int) else None


def _eager_q_len(ev: GpuEvent) -> int | None:
    """Query length of eager attention's batched GEMMs (scores ``[B*H, q, d] @ [B*H, d, k]``, then
    ``[B*H, q, k] @ [B*H, k, v]``): the rows of their first input."""
    op, dims = ev.launch_op, ev.launch_dims
    if op not in ("aten::bmm", "aten::baddbmm", "aten::matmul") or not isinstance(dims, list) or not dims:
        return None
    a = dims[0] if op != "aten::baddbmm" or len(dims) < 2 else dims[1]
    if not isinstance(a, list) or len(a) not in (3, 4):
        return None
    v = a[-2]
    return v if isinstance(v, int) else None


class Analyzer:
    """Analyzes one rank's :class:`TraceData` with a pattern set."""

    def __init__(self, patterns: PatternSet, classifier: KernelClassifier | None = None) -> None:
        self.patterns = patterns
        self.clf = classifier or KernelClassifier(patterns)

    # ---- passes -------------------------------------------------------------------------------
    def passes(self, data: TraceData, notes: list[str], skip: int = 0) -> tuple[list[_Pass], list[int]]:
        """Passes of the device events from ``skip`` on (those before were launched before the window)."""
        gpu = data.gpu
        steps = find_steps(data.host, self.patterns)
        if steps:
            passes = [_Pass([], s.name, s.stage, "annotation", s.tokens) for s in steps]
            starts = [s.start for s in steps]
            unassigned: list[int] = list(range(skip))
            for i in range(skip, len(gpu)):
                g = gpu[i]
                t = g.ts if steps[0].gpu_clock or g.launch_ts is None else g.launch_ts
                k = _find(starts, t)
                if k >= 0 and (t <= steps[k].end or g.launch_ts is None):
                    passes[k].events.append(i)
                else:
                    unassigned.append(i)
            kept = [p for p in passes if p.events]
            if len(kept) < len(passes):
                notes.append(f"{len(passes) - len(kept)} step annotation(s) without device activity ignored")
            split = [q for p in kept for q in self._split_generate(gpu, p)]
            if len(split) > len(kept):
                notes.append(
                    f"{len(split) - len(kept)} more pass(es) found inside stage-less step annotations "
                    "(ProfilerStep around a generate): split after sampling kernels"
                )
            return split, unassigned
        # no annotations: a sampling kernel ends each generate iteration
        chunks: list[_Pass] = [_Pass([])]
        prev_sampling = False
        for i in range(skip, len(gpu)):
            g = gpu[i]
            sampling = g.ktype == "sampling"
            if prev_sampling and not sampling:
                chunks.append(_Pass([]))
            chunks[-1].events.append(i)
            prev_sampling = sampling
        if len(chunks) == 1:
            notes.append("no step annotations or sampling kernels: the whole trace read as one pass")
        else:
            notes.append("no step annotations: passes split after sampling kernels")
        return chunks, list(range(skip))

    @staticmethod
    def _split_generate(gpu: list[GpuEvent], p: _Pass) -> list[_Pass]:
        """A step annotation without a stage (``ProfilerStep#N``) may hold a whole ``generate``: split it
        after each run of sampling kernels that more work follows."""
        if p.stage != "unknown":
            return [p]
        parts: list[list[int]] = [[]]
        prev_sampling = False
        for i in p.events:
            sampling = gpu[i].ktype == "sampling"
            if prev_sampling and not sampling:
                parts.append([])
            parts[-1].append(i)
            prev_sampling = sampling
        if len(parts) == 1:
            return [p]
        return [_Pass(events, p.annotation, p.stage, p.source, p.tokens, part=True) for events in parts]

    # ---- layers -------------------------------------------------------------------------------
    def layers(self, gpu: list[GpuEvent], p: _Pass) -> None:
        seq = p.events
        n = len(seq)
        is_marker = [False] * n
        is_ffn = [False] * n
        prev_norm = False
        for j, idx in enumerate(seq):
            g = gpu[idx]
            if g.kind != "kernel":
                continue
            norm = g.ktype == "norm"
            is_marker[j] = g.layer_start or (norm and not prev_norm)
            prev_norm = norm
            is_ffn[j] = g.ktype in _FFN_TYPES or self.clf.is_ffn(g.name)
        blocks: list[list[int]] = []
        since_break = True
        for j, idx in enumerate(seq):
            g = gpu[idx]
            if g.ktype == "attention":
                if since_break or not blocks:
                    blocks.append([j, j + 1])
                else:
                    blocks[-1][1] = j + 1
                since_break = False
            elif g.ktype == "gemm" or is_marker[j]:
                since_break = True
        if not blocks:
            return
        blocks = _merge_blocks(blocks, is_ffn)

        def first(flags: list[bool], lo: int, hi: int) -> int | None:
            for k in range(lo, hi):
                if flags[k]:
                    return k
            return None

        def markers(lo: int, hi: int) -> list[int]:
            return [k for k in range(lo, hi) if is_marker[k]]

        starts: list[int] = []
        m0 = first(is_marker, 0, blocks[0][0])
        starts.append(m0 if m0 is not None else 0)
        for (_, a_hi), (b_lo, _) in itertools.pairwise(blocks):
            f = first(is_ffn, a_hi, b_lo)
            b = first(is_marker, f + 1, b_lo) if f is not None else None
            if b is None:
                ms = markers(a_hi, b_lo)
                b = ms[1] if len(ms) >= 2 else (ms[0] if ms else (a_hi + b_lo + 1) // 2)
            starts.append(b)
        a_hi = blocks[-1][1]
        f = first(is_ffn, a_hi, n)
        end = first(is_marker, f + 1, n) if f is not None else None
        if end is None:
            ms = markers(a_hi, n)
            end = ms[1] if len(ms) >= 2 else n
            if f is not None:
                s = next((k for k in range(f, n) if gpu[seq[k]].ktype == "sampling"), None)
                end = s if s is not None else n
        bounds = [*starts, end]
        for li, blk in enumerate(blocks):
            lo, hi = bounds[li], max(bounds[li + 1], blk[1])
            split = first(is_marker, blk[1], hi)
            layer = _Layer(lo, hi, blk[1], split)
            layer.norms = sum(is_marker[lo:hi])
            layer.mla = any(self.clf.is_mla(gpu[seq[k]].name) for k in range(lo, hi) if gpu[seq[k]].kind == "kernel")
            p.layers.append(layer)

    # ---- stages -------------------------------------------------------------------------------
    def stages(self, gpu: list[GpuEvent], passes: list[_Pass], notes: list[str]) -> None:
        any_votes = False
        for p in passes:
            if p.source == "annotation" and p.stage != "unknown":
                for layer in p.layers:
                    layer.stage, layer.source = p.stage, "annotation"
                continue
            for layer in p.layers:
                votes: Counter[str] = Counter()
                shapes: Counter[str] = Counter()
                for k in range(layer.lo, layer.hi):
                    g = gpu[p.events[k]]
                    if g.vote:
                        votes[g.vote] += 1
                    if g.ktype == "attention":
                        q = _q_len(g)
                        if q is None:
                            q = _eager_q_len(g)
                        if q is not None:
                            shapes["decode" if q == 1 else "prefill"] += 1
                if shapes:
                    # attention input shapes are measurements: the query length says it
                    (top, c1), *rest = shapes.most_common(2)
                    if not rest or rest[0][1] < c1:
                        layer.stage, layer.source = top, "shape"
                        any_votes = True
                elif votes:
                    # prefill-only kernels outweigh decode votes: paged-attention kernels run in prefill too
                    layer.stage = "prefill" if votes["prefill"] else "decode"
                    layer.source = "vote"
                    any_votes = True
            known = [layer.stage for layer in p.layers if layer.stage != "unknown"]
            for i, layer in enumerate(p.layers):
                if layer.stage == "unknown" and known:
                    prev = next((x.stage for x in reversed(p.layers[:i]) if x.stage != "unknown"), None)
                    nxt = next((x.stage for x in p.layers[i + 1 :] if x.stage != "unknown"), None)
                    layer.stage = prev or nxt or "unknown"
                    layer.source = "propagated"
            if known:
                top = Counter(known).most_common(1)[0][0]
                p.stage = top
                p.source = Counter(x.source for x in p.layers if x.stage == top).most_common(1)[0][0]
                if p.source == "propagated":
                    p.source = "vote"
        self._timing_outliers(gpu, passes, notes)
        self._graph_replays(gpu, passes, notes)
        undecided = [p for p in passes if p.layers and p.stage == "unknown"]
        if undecided and len(undecided) >= 2:
            per_layer = [sum(gpu[i].dur for i in p.events) / max(len(p.layers), 1) for p in undecided]
            typical = statistics.median(per_layer[1:])
            if per_layer[0] > 2.0 * typical and all(x < 2.0 * typical for x in per_layer[1:]):
                for i, p in enumerate(undecided):
                    p.stage, p.source = ("prefill" if i == 0 else "decode"), "timing"
                    for layer in p.layers:
                        layer.stage, layer.source = p.stage, "timing"
                notes.append(
                    "no stage annotations, stage kernels or attention shapes: stages guessed from timing "
                    "(a long first pass read as prefill, the similar short ones as decode)"
                )
        elif not any_votes and any(p.layers for p in passes) and not any(p.source == "annotation" for p in passes):
            notes.append("no evidence for stages (annotations, stage kernels, attention shapes): stages unknown")

    def _timing_outliers(self, gpu: list[GpuEvent], passes: list[_Pass], notes: list[str]) -> None:
        """A pass that takes several times the median pass of a series is a prefill, whatever the kernel
        votes say (a 130 ms step among 17 ms steps); measured shapes and annotations are not overruled."""
        timed = [p for p in passes if p.layers]
        if len(timed) < 3:
            return
        times = [sum(gpu[i].dur for i in p.events if gpu[i].kind == "kernel") for p in timed]
        typical = statistics.median(times)
        if typical <= 0:
            return
        changed = 0
        for p, t in zip(timed, times, strict=True):
            if t > _OUTLIER * typical and p.source not in ("annotation", "shape") and p.stage != "prefill":
                p.stage, p.source = "prefill", "timing"
                for layer in p.layers:
                    layer.stage, layer.source = "prefill", "timing"
                changed += 1
        if changed:
            notes.append(
                f"{changed} pass(es) taking over {_OUTLIER:g}x the median pass read as prefill "
                "(timing outweighs decode votes of kernels that also run in prefill)"
            )

    def _graph_replays(self, gpu: list[GpuEvent], passes: list[_Pass], notes: list[str]) -> None:
        """Undecided passes whose layers replay a CUDA graph, after an eager pass, are decode steps.

        A CUDA graph replays fixed shapes, so frameworks capture the step whose shape does not change
        (one new token per sequence: decode; HF's static cache, SGLang, TensorRT-LLM) and run the prefill,
        whose length follows the prompt, eagerly. Replayed kernels carry no CPU op shapes and often no
        stage-specific name, so the graph itself is the evidence, checked against timing: a pass counts
        as decode when all its layers' attention kernels came from a ``cudaGraphLaunch`` and its layers
        took less kernel time than those of an earlier pass launched eagerly (that pass, if undecided, is
        the prefill). Annotations, shapes and votes already given are not overruled."""

        def replayed(p: _Pass) -> bool | None:
            attn = [
                gpu[p.events[k]]
                for layer in p.layers
                for k in range(layer.lo, layer.attn_end)
                if gpu[p.events[k]].ktype == "attention"
            ]
            if not attn:
                return None
            return all(g.launch_name is not None and "GraphLaunch" in g.launch_name for g in attn)

        def per_layer(p: _Pass) -> float:
            t = sum(
                gpu[p.events[k]].dur
                for layer in p.layers
                for k in range(layer.lo, layer.hi)
                if gpu[p.events[k]].kind == "kernel"
            )
            return t / len(p.layers)

        eager: _Pass | None = None
        found: list[_Pass] = []
        for p in passes:
            if not p.layers:
                continue
            graph = replayed(p)
            if graph is False and eager is None and p.stage in ("prefill", "unknown"):
                eager = p
            elif graph and eager is not None and p.stage == "unknown" and per_layer(p) < per_layer(eager):
                found.append(p)
        if not found or eager is None:
            return
        for p, stage in ((eager, "prefill"), *((q, "decode") for q in found)):
            if p.stage == "unknown":
                p.stage, p.source = stage, "timing"
                for layer in p.layers:
                    layer.stage, layer.source = stage, "timing"
        notes.append(
            f"{len(found)} pass(es) replaying CUDA graphs with shorter layers than the eager first pass read as "
            "decode (graphs replay the fixed-shape decode step; replayed kernels carry no shapes to vote with)"
        )

    # ---- the whole analysis -----------------------------------------------------------------------
    def classify(self, data: TraceData) -> None:
        """Type every device event of ``data`` (:meth:`KernelClassifier.classify`, with its host scopes) and
        keep what the typing assumed (GEMMs retyped as MoE expert GEMMs) in ``data.notes``, in place of such
        notes of an earlier typing (a timeline's, read back)."""
        typed = self.clf.classify(data.gpu, data.host)
        data.notes = [n for n in data.notes if EXPERT_NOTE_MARK not in n] + typed

    def _structure(self, data: TraceData, notes: list[str]) -> tuple[list[_Pass], int]:
        """Passes with their layers and stages of classified events; the count of window leftovers."""
        gpu = data.gpu
        skip = window_leftovers(gpu, data.host)
        if skip:
            notes.append(
                window_note(
                    gpu,
                    skip,
                    "set apart, left out of every total and table here and of passes and layers, as "
                    "`opgraph compare` leaves them out",
                )
            )
        passes, _ = self.passes(data, notes, skip)
        for p in passes:
            self.layers(gpu, p)
        found = len(passes)
        passes = [p for p in passes if p.layers or (p.annotation and not p.part)]
        if found and not passes:
            notes.append("no transformer layers found (no attention kernels): 0 passes")
        self.stages(gpu, passes, notes)
        return passes, skip

    def _outside_types(self, gpu: list[GpuEvent], in_layer: list[bool]) -> None:
        # kernels outside layers may take another type (topk after the LM head is sampling, not MoE)
        for j, g in enumerate(gpu):
            if not in_layer[j] and g.kind == "kernel":
                out = self.clf.outside_type(g.name)
                if out is not None:
                    g.ktype = out

    def labels(self, data: TraceData) -> list[Label]:
        """The (layer, stage, pass) label of every device event (and its final kernel type, with the typing's
        notes in ``data.notes``), as :meth:`run` gives them without splitting half layers, without building
        the summary."""
        gpu = data.gpu
        self.classify(data)
        passes, _ = self._structure(data, [])
        labels: list[Label] = [(None, None, None)] * len(gpu)
        in_layer = [False] * len(gpu)
        gindex = 0
        for pi, p in enumerate(passes):
            for j in p.events:
                labels[j] = (None, p.stage, pi)
            for layer in p.layers:
                for j in p.events[layer.lo : layer.hi]:
                    labels[j] = (gindex, layer.stage, pi)
                    in_layer[j] = True
                gindex += 1
        self._outside_types(gpu, in_layer)
        return labels

    def run(self, data: TraceData, *, split_half_layers: bool = False) -> tuple[AnalysisResult, list[Label]]:
        """The analysis of ``data`` and the (layer, stage, pass) label of every device event."""
        gpu = data.gpu
        self.classify(data)
        notes = list(data.notes)
        passes, skip = self._structure(data, notes)
        labels: list[Label] = [(None, None, None)] * len(gpu)
        in_layer = [False] * len(gpu)
        layer_infos: list[LayerInfo] = []
        pass_infos: list[PassInfo] = []
        gindex = 0
        merged_halves = 0
        for pi, p in enumerate(passes):
            for j in p.events:
                labels[j] = (None, p.stage, pi)
            units: list[tuple[_Layer, int, int, str, int]] = []
            for layer in p.layers:
                kind_full = self._kind(gpu, p, layer.lo, layer.hi, layer.attn_end, layer.mla, True)
                if layer.split is not None and layer.split > layer.attn_end - 1:
                    merged_halves += 1
                if split_half_layers and layer.split is not None:
                    units.append((layer, layer.lo, layer.split, self._half_kind(gpu, p, layer.lo, layer.split), 1))
                    units.append((layer, layer.split, layer.hi, self._half_kind(gpu, p, layer.split, layer.hi), 1))
                else:
                    units.append((layer, layer.lo, layer.hi, kind_full, 2 if layer.split is not None else 1))
            for li, (layer, lo, hi, kind, halves) in enumerate(units):
                idxs = p.events[lo:hi]
                t: dict[str, float] = defaultdict(float)
                count = 0
                for j in idxs:
                    g = gpu[j]
                    labels[j] = (gindex, layer.stage, pi)
                    in_layer[j] = True
                    if g.kind == "kernel":
                        count += 1
                        t[g.ktype] += g.dur
                        t["all"] += g.dur
                start = gpu[idxs[0]].ts if idxs else 0.0
                end = max((gpu[j].ts + gpu[j].dur for j in idxs), default=start)
                layer_infos.append(
                    LayerInfo(
                        index=gindex,
                        pass_index=pi,
                        layer=li,
                        kind=kind,
                        stage=layer.stage,
                        stage_source=layer.source,
                        start_us=round(start, 3),
                        end_us=round(end, 3),
                        kernels=count,
                        time_us=round(t["all"], 3),
                        attention_us=round(t["attention"], 3),
                        gemm_us=round(t["gemm"], 3),
                        moe_us=round(t["moe"], 3),
                        communication_us=round(t["communication"], 3),
                        norms=sum(
                            1
                            for k in range(lo, hi)
                            if gpu[p.events[k]].layer_start
                            or (gpu[p.events[k]].ktype == "norm" and (k == 0 or gpu[p.events[k - 1]].ktype != "norm"))
                        ),
                        half_layers=halves,
                    )
                )
                gindex += 1
            evs = [gpu[j] for j in p.events]
            pass_infos.append(
                PassInfo(
                    index=pi,
                    stage=p.stage,
                    stage_source=p.source,
                    layers=len(units),
                    kernels=sum(1 for g in evs if g.kind == "kernel"),
                    time_us=round(sum(g.dur for g in evs if g.kind == "kernel"), 3),
                    start_us=round(min((g.ts for g in evs), default=0.0), 3),
                    end_us=round(max((g.ts + g.dur for g in evs), default=0.0), 3),
                    annotation=p.annotation,
                    tokens=p.tokens,
                )
            )
        self._outside_types(gpu, in_layer)
        result = self._summarize(
            data, passes, pass_infos, layer_infos, labels, in_layer, notes, split_half_layers, skip
        )
        if skip:
            result = result.model_copy(
                update={"window_events": skip, "window_time_us": round(sum(g.dur for g in gpu[:skip]), 3)}
            )
        if merged_halves and not split_half_layers:
            result = result.model_copy(update={"half_layers_merged": True})
        return result, labels

    def _kind(self, gpu: list[GpuEvent], p: _Pass, lo: int, hi: int, attn_end: int, mla: bool, full: bool) -> str:
        types = {gpu[p.events[k]].ktype for k in range(attn_end, hi) if gpu[p.events[k]].kind == "kernel"}
        ffn = "MOE" if "moe" in types else ("FC" if types & {"activation", "gemm"} else "")
        attn = "MLA" if mla else "MHA"
        if not ffn:
            return "ATTN"
        return f"{attn}_{ffn}"

    def _half_kind(self, gpu: list[GpuEvent], p: _Pass, lo: int, hi: int) -> str:
        types = {gpu[p.events[k]].ktype for k in range(lo, hi) if gpu[p.events[k]].kind == "kernel"}
        if "attention" in types:
            return "ATTN"
        if "moe" in types:
            return "MOE"
        if types & {"activation", "gemm"}:
            return "FC"
        return "UNKNOWN"

    def _summarize(
        self,
        data: TraceData,
        passes: list[_Pass],
        pass_infos: list[PassInfo],
        layer_infos: list[LayerInfo],
        labels: list[Label],
        in_layer: list[bool],
        notes: list[str],
        split: bool,
        skip: int = 0,
    ) -> AnalysisResult:
        """The result's totals and tables: of the trace's own device work, the first ``skip`` events (work
        launched before the profiler window opened, :func:`~opgraph.trace.window.window_leftovers`) left out."""
        gpu = data.gpu
        own = gpu[skip:]
        kernels = [(j, g) for j, g in enumerate(gpu) if j >= skip and g.kind == "kernel"]
        total = sum(g.dur for _, g in kernels) or 0.0
        denom = total or 1.0
        by_type: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        by_stage: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        by_st: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        uniq: dict[str, list[Any]] = {}
        for j, g in kernels:
            stage = labels[j][1] or "unknown"
            for d, key in ((by_type, g.ktype), (by_stage, stage)):
                d[key][0] += 1
                d[key][1] += g.dur
            st = by_st[(stage, g.ktype)]
            st[0] += 1
            st[1] += g.dur
            u = uniq.get(g.name)
            if u is None:
                uniq[g.name] = u = [Counter(), 0, 0.0, g.dur, g.dur, set(), Counter(), []]
            u[0][g.ktype] += g.dur + 1e-9  # a name's type: where most of its time went (launch ops may differ)
            u[1] += 1
            u[2] += g.dur
            u[3] = min(u[3], g.dur)
            u[4] = max(u[4], g.dur)
            u[5].add(stage)
            if g.launch_op:
                u[6][g.launch_op] += 1
            if g.grid and g.grid not in u[7] and len(u[7]) < 3:
                u[7].append(g.grid)

        def buckets(d: dict[str, list[float]], order: Sequence[str] = ()) -> tuple[Bucket, ...]:
            keys = sorted(d, key=lambda k: (order.index(k) if k in order else len(order), -d[k][1]))
            return tuple(
                Bucket(name=k, count=int(d[k][0]), time_us=round(d[k][1], 3), pct=round(100 * d[k][1] / denom, 3))
                for k in keys
            )

        uniques = tuple(
            UniqueKernel(
                name=name,
                short_name=self.patterns.short_name(name),
                type=u[0].most_common(1)[0][0],
                count=u[1],
                total_us=round(u[2], 3),
                mean_us=round(u[2] / u[1], 3),
                min_us=round(u[3], 3),
                max_us=round(u[4], 3),
                pct=round(100 * u[2] / denom, 3),
                stages=tuple(s for s in _STAGE_ORDER if s in u[5]),
                launch_ops=tuple(op for op, _ in u[6].most_common(3)),
                grids=tuple(u[7]),
            )
            for name, u in sorted(uniq.items(), key=lambda kv: (-kv[1][2], kv[0]))
        )
        unknown = tuple(u for u in uniques if u.type == "unknown")
        unk_t = sum(u.total_us for u in unknown)
        unk_n = sum(u.count for u in unknown)
        comm: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for _, g in kernels:
            if g.ktype == "communication":
                c = comm[self.patterns.short_name(g.name)]
                c[0] += 1
                c[1] += g.dur
        mem = [g for g in own if g.kind != "kernel"]
        orphans = [g for j, g in kernels if not in_layer[j]]
        stage_passes = Counter(p.stage for p in pass_infos)
        attention = "none"
        if any(p.layers for p in passes):
            attention = "mla" if any(layer.mla for p in passes for layer in p.layers) else "mha"
        if unk_n:
            notes.append(
                f"{unk_n} kernels ({len(unknown)} distinct, {100 * unk_t / denom:.1f}% of kernel time) match no "
                "pattern: add rules with --patterns FILE (see `opgraph analyze -v`)"
            )
        return AnalysisResult(
            source=data.file,
            device=data.device_name,
            rank=data.rank,
            complete=data.complete,
            notes=tuple(notes + [f"incomplete: {r}" for r in data.incomplete]),
            kernels=len(kernels),
            kernel_time_us=round(total, 3),
            memcpy=len(mem),
            memcpy_time_us=round(sum(g.dur for g in mem), 3),
            gpu_busy_us=round(union_length((g.ts, g.ts + g.dur) for g in own), 3),
            makespan_us=round(max((g.ts + g.dur for g in own), default=0.0) - min((g.ts for g in own), default=0.0), 3),
            unknown_pct=round(100 * unk_t / denom, 3),
            unknown_count_pct=round(100 * unk_n / max(len(kernels), 1), 3),
            attention=attention,
            half_layers_merged=False,
            split_half_layers=split,
            by_type=buckets(by_type),
            by_stage=buckets(by_stage, _STAGE_ORDER),
            by_stage_type=tuple(
                StageTypeRow(stage=s, type=t, count=int(v[0]), time_us=round(v[1], 3))
                for (s, t), v in sorted(by_st.items(), key=lambda kv: (_STAGE_ORDER.index(kv[0][0]), -kv[1][1]))
            ),
            passes=tuple(pass_infos),
            layers_per_pass=tuple(p.layers for p in pass_infos),
            stage_passes=dict(sorted(stage_passes.items())),
            layers=tuple(layer_infos),
            orphan_kernels=len(orphans),
            orphan_time_us=round(sum(g.dur for g in orphans), 3),
            unique_kernels=uniques,
            unknown_kernels=unknown,
            collectives=tuple(
                CollectiveInfo(name=k, count=int(v[0]), time_us=round(v[1], 3))
                for k, v in sorted(comm.items(), key=lambda kv: -kv[1][1])
            ),
            patterns=tuple(self.patterns.families),
        )


def _merge_blocks(blocks: list[list[int]], is_ffn: list[bool]) -> list[list[int]]:
    """Attention blocks with no feed-forward part between them belong to one layer (TimeSformer's temporal and
    spatial attention, a decoder's self- and cross-attention), provided other gaps of the pass do hold one:
    where no gap has an FFN marker the markers are missing, not the layers."""
    if len(blocks) < 2:
        return blocks
    has_ffn = [any(is_ffn[a_hi:b_lo]) for (_, a_hi), (b_lo, _) in itertools.pairwise(blocks)]
    if not any(has_ffn) or all(has_ffn):
        return blocks
    merged = [list(blocks[0])]
    for blk, ffn_before in zip(blocks[1:], has_ffn, strict=True):
        if ffn_before:
            merged.append(list(blk))
        else:
            merged[-1][1] = blk[1]
    return merged


def _find(starts: list[float], t: float) -> int:
    import bisect

    return bisect.bisect_right(starts, t) - 1
