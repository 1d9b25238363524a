"""Kernel classification: type, stage vote and layer-start marker of every device event."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Hashable, Sequence

from opgraph.ir.timeline import SpanCategory
from opgraph.trace.events import GpuEvent, HostEvent
from opgraph.trace.patterns import KernelType, PatternSet

_MEMORY = KernelType.MEMORY
_COMM = KernelType.COMMUNICATION
_GEMM = KernelType.GEMM
_ATTENTION = KernelType.ATTENTION
_SOFTMAX_OPS = ("aten::_softmax", "aten::softmax", "aten::_safe_softmax")
_BATCHED_OPS = ("aten::bmm", "aten::baddbmm", "aten::matmul")
_BETWEEN = frozenset(
    {KernelType.ELEMENTWISE, KernelType.MEMORY, KernelType.OTHER, KernelType.ACTIVATION, KernelType.UNKNOWN}
)
"""Kernel types that may sit between the GEMMs and the softmax of eager attention (scale, mask, cast,
dropout); a router's top-k (MoE, sampling, reduction) may not."""
_REACH = 4
"""Calls after the softmax (cast, dropout, slicing copies) before the value GEMM."""
_REACH_BEFORE = 6
"""Calls between the score GEMM and the softmax: scale, mask, soft-cap, and the attention-sink steps
(``cat`` of the sink logits, their row ``max``, ``sub``) that gpt-oss's eager attention adds. A call's kernels
count once: ATen splits an elementwise op or reduction over a tensor past 2^31 bytes into several
(gpt-oss's row ``max`` and ``sub`` over 4096 x 4097 scores a head, two kernels each)."""
_ROW_MAX_OPS = frozenset({"aten::max", "aten::amax", "aten::logsumexp"})
"""Row reductions that may sit before the softmax: the stabilising max a hand-written (sink) softmax takes
first. Only these reductions: a router's top-k is not attention."""
_MOE = KernelType.MOE
_EXPERT_OPS = ("aten::bmm", "aten::baddbmm")
"""Batched GEMM ops that run experts on their gathered weights (transformers' ``batched_mm`` experts: an
``aten::index`` of the stacked ``[experts, n, k]`` weights by the routed expert ids, then one ``bmm``)."""
_MOE_REACH = 24
"""Kernels after an MoE kernel (the router's top-k, or an expert GEMM) within which a batched GEMM is taken
for an expert's: the top-k weights' normalisation, casts, the expert-id clamp and the weight gathers."""
_BLOCK_END = frozenset({KernelType.NORM, KernelType.ATTENTION, KernelType.SAMPLING, KernelType.EMBEDDING})
"""Kernel types that end an MoE block: the next layer's norm and attention, or a new pass (the LM head's
sampling, the embedding)."""
_LOOP_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"})
"""Unbatched GEMM ops, as an eager experts loop runs them (``F.linear`` of one expert's weights)."""
_LOOP_EXPERTS = 2
"""Calls of the up and of the down projection an MoE block must hold for its GEMMs to read as a loop over
experts: one expert's pair is also what a dense MLP (a shared expert) runs."""
_SCOPE_KINDS = (SpanCategory.ANNOTATION, SpanCategory.PYTHON)
"""Host events that name a module scope: ``record_function`` ranges and ``nn.Module`` Python events."""
EXPERT_NOTE_MARK = "typed moe, not gemm"
"""The words of every note on GEMMs that the classifier retyped as MoE expert GEMMs."""


_UNKNOWN = KernelType.UNKNOWN
_ATEN_MEMORY = (
    "copy",
    "cat",
    "index",
    "gather",
    "scatter",
    "fill",
    "zero",
    "clone",
    "contiguous",
    "to",
    "stack",
    "repeat",
    "pad",
    "masked_scatter",
    "put",
    "flip",
    "roll",
    "narrow",
    "slice",
    "expand",
    "tril",
    "triu",
)
_ATEN_REDUCTION = (
    "sum",
    "mean",
    "cumsum",
    "cumprod",
    "max",
    "min",
    "amax",
    "amin",
    "prod",
    "any",
    "all",
    "norm",
    "var",
    "std",
    "sort",
    "topk",
    "nonzero",
    "unique",
    "histc",
    "bincount",
    "count_nonzero",
    "logsumexp",
)
_ATEN_SAMPLING = ("argmax", "argmin", "multinomial", "exponential", "uniform", "normal", "bernoulli", "randperm")


def aten_fallback(op: str) -> KernelType:
    """The type of a kernel no name rule knows, from the ATen op that launched it (``aten::cumsum`` is a
    reduction); other launching ops leave it unknown."""
    if not op.startswith("aten::"):
        return _UNKNOWN
    base = op[6:].strip("_").split(".")[0]
    head = base.split("_")[0]
    if base in _ATEN_SAMPLING or head in _ATEN_SAMPLING:
        return KernelType.SAMPLING
    if base in _ATEN_REDUCTION or head in _ATEN_REDUCTION:
        return KernelType.REDUCTION
    if base in _ATEN_MEMORY or head in _ATEN_MEMORY:
        return _MEMORY
    return KernelType.ELEMENTWISE


def _is_softmax(ev: GpuEvent) -> bool:
    if ev.launch_op is not None:
        return ev.launch_op in _SOFTMAX_OPS
    return "softmax" in ev.name.lower() and ev.ktype is KernelType.ACTIVATION


def _batched(ev: GpuEvent) -> bool:
    """A GEMM that may be attention's: launched by a batched matmul op, or of unknown origin."""
    return ev.ktype is _GEMM and (not ev.launch_stack or any(op in _BATCHED_OPS for op in ev.launch_stack))


def eager_attention(kernels: list[GpuEvent]) -> None:
    """Type eager attention as attention, in one stream's kernel order: a batched GEMM (scores); at most
    :data:`_REACH_BEFORE` scale/mask/cast/concat kernels and row maxima (a sink softmax: ``cat`` the sink
    logits, take the row ``max``, subtract it); a softmax; at most :data:`_REACH` more (cast, dropout,
    slice); a batched GEMM (weighted values). Any other kernel in between (a router's top-k, a norm, an
    unbatched GEMM) means it is not attention."""
    for i, ev in enumerate(kernels):
        if not _is_softmax(ev):
            continue
        lo = _batched_within(kernels, range(i - 1, -1, -1), _REACH_BEFORE, row_max=True)
        hi = _batched_within(kernels, range(i + 1, len(kernels)), _REACH, row_max=False) if lo is not None else None
        if lo is None or hi is None:
            continue
        for k in kernels[lo : hi + 1]:
            k.ktype = _ATTENTION


def _batched_within(kernels: list[GpuEvent], order: range, reach: int, *, row_max: bool) -> int | None:
    """The index of the first batched GEMM in ``order`` reached within ``reach`` calls (a call's kernels
    counted once) over kernels that may sit inside eager attention (``row_max``: a row maximum too), or
    ``None``."""
    calls: set[int] = set()
    for j in order:
        k = kernels[j]
        calls.add(id(k.launch_host) if k.launch_host is not None else id(k))
        if len(calls) > reach:
            return None
        if _batched(k):
            return j
        if k.ktype not in _BETWEEN and not (
            row_max and k.ktype is KernelType.REDUCTION and k.launch_op in _ROW_MAX_OPS
        ):
            return None
    return None


def expert_gemms(kernels: list[GpuEvent]) -> None:
    """Type as MoE the expert GEMMs that batched GEMM ops run, in one stream's kernel order.

    A grouped GEMM op says it runs experts (``aten::_grouped_mm``, a ``[[launch]]`` rule); a plain
    ``aten::bmm`` does not: transformers runs the same expert GEMMs with ``_grouped_mm`` in prefill and,
    for a few tokens, as one ``bmm`` over the routed experts' gathered weights in decode. Such a GEMM is an
    expert's when it follows an MoE kernel of the block (the router's top-k, or the expert GEMM before it)
    by at most :data:`_MOE_REACH` kernels, with no norm, attention, sampling or embedding kernel or layer
    start between: the block ends there. A batched GEMM elsewhere (eager attention, RoPE's angles) keeps
    its type, and so does an unbatched one inside the block (a shared expert's ``linear``)."""
    last_moe: int | None = None
    for i, ev in enumerate(kernels):
        kt = ev.ktype
        if kt is _MOE:
            last_moe = i
        elif kt in _BLOCK_END or ev.layer_start:
            last_moe = None
        elif (
            kt is _GEMM
            and last_moe is not None
            and i - last_moe <= _MOE_REACH
            and any(op in _EXPERT_OPS for op in ev.launch_stack)
        ):
            ev.ktype = _MOE
            last_moe = i


def expert_scopes(gpu: Sequence[GpuEvent], host: Sequence[HostEvent], patterns: PatternSet) -> list[str]:
    """Type as MoE the GEMMs launched inside an MoE experts scope (a host range whose name matches a
    ``[layers] experts`` rule: ``model.layers.0.mlp.experts``); the notes that say how many.

    An eager experts implementation (transformers' ``eager`` experts, a ``ModuleList`` of expert MLPs)
    runs one ``aten::mm`` per expert that received tokens, which no launching op tells from a dense
    GEMM; the module scope around the launch does. A GEMM's launch (host clock) must lie inside the
    scope, on the same thread when the launching op is known."""
    spans: dict[int | str, list[tuple[float, float]]] = defaultdict(list)
    names: list[str] = []
    for h in host:
        if h.kind in _SCOPE_KINDS and patterns.is_experts_scope(h.name):
            spans[h.tid].append((h.ts, h.ts + h.dur))
            if h.name not in names:
                names.append(h.name)
    if not spans:
        return []
    merged = {tid: _merge(iv) for tid, iv in spans.items()}
    starts = {tid: [a for a, _ in iv] for tid, iv in merged.items()}
    retyped = 0
    for ev in gpu:
        t = ev.launch_ts
        if ev.ktype is not _GEMM or t is None:
            continue
        tids = [ev.launch_host.tid] if ev.launch_host is not None else list(merged)
        for tid in tids:
            iv = merged.get(tid)
            if iv is None:
                continue
            k = bisect.bisect_right(starts[tid], t) - 1
            if k >= 0 and t <= iv[k][1]:
                ev.ktype = _MOE
                retyped += 1
                break
    if not retyped:
        return []
    shown = ", ".join(repr(n) for n in names[:2]) + (", ..." if len(names) > 2 else "")
    return [
        f"{retyped} GEMM kernels launched inside MoE experts scopes ({shown}) {EXPERT_NOTE_MARK}: the experts "
        "module runs one GEMM per expert that received tokens (an eager experts loop), which no launching op "
        "names (scopes matched by the pattern files' layers.experts rules)"
    ]


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or nested intervals as their union, sorted by start."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def gemm_nk(ev: GpuEvent) -> tuple[int, int] | None:
    """(n, k) of the GEMM op that launched ``ev``, from its input shapes (with ``record_shapes``):
    ``mm([m, k], [k, n])``, ``matmul([.., m, k], [k, n])``, ``addmm(bias, [m, k], [k, n])``,
    ``linear([.., k], [n, k])``; None for other ops or without shapes."""
    op, dims = ev.launch_op, ev.launch_dims
    if not isinstance(dims, list):
        return None
    if op in ("aten::mm", "aten::matmul") and len(dims) >= 2:
        w = dims[1]
        nk = (w[-1], w[-2]) if isinstance(w, list) and len(w) == 2 else None
    elif op == "aten::addmm" and len(dims) >= 3:
        w = dims[2]
        nk = (w[-1], w[-2]) if isinstance(w, list) and len(w) == 2 else None
    elif op == "aten::linear" and len(dims) >= 2:
        w = dims[1]
        nk = (w[0], w[1]) if isinstance(w, list) and len(w) == 2 else None
    else:
        return None
    if nk is None or not all(type(x) is int for x in nk):
        return None
    return nk


def _call(ev: GpuEvent) -> Hashable:
    """One GEMM call, whatever kernels it launched (a split-K GEMM and its reduce kernel are one call)."""
    if ev.launch_host is not None:
        return id(ev.launch_host)
    if ev.external_id is not None:
        return ("ext", ev.external_id)
    return ("launch", ev.launch_ts if ev.launch_ts is not None else id(ev))


def expert_loops(kernels: list[GpuEvent]) -> tuple[int, int, int]:
    """Type as MoE the GEMMs of an eager per-expert loop, in one stream's kernel order; (kernels retyped,
    their calls, MoE blocks holding them).

    Without a module scope (:func:`expert_scopes`) the loop is known by its shapes. An MoE block runs from
    an MoE kernel (the router's top-k) to the next norm, attention, sampling or embedding kernel or layer
    start. In it, each expert that received tokens runs its up projection (``n`` the expert's
    intermediate size ``i``, or ``2i`` with gate and up fused; ``k`` the hidden size ``h``) and its down
    projection (``n = h``, ``k = i``) as unbatched GEMMs. A down shape and a matching up shape both called
    at least :data:`_LOOP_EXPERTS` times are the loop: their GEMMs are MoE. The router's GEMM (``n`` the
    expert count) is called once, and a shared expert's MLP calls its down projection once, so both stay
    dense; a block with one expert is left as it is. Needs the ops' input shapes (``record_shapes``)."""
    retyped = calls_retyped = blocks = 0
    block: list[GpuEvent] | None = None

    def close(block: list[GpuEvent]) -> None:
        nonlocal retyped, calls_retyped, blocks
        calls: dict[tuple[int, int], set[Hashable]] = defaultdict(set)
        for ev in block:
            nk = gemm_nk(ev)
            if nk is not None:
                calls[nk].add(_call(ev))
        count = {nk: len(c) for nk, c in calls.items()}
        loop: set[tuple[int, int]] = set()
        for (n_down, k_down), c_down in count.items():
            if c_down < _LOOP_EXPERTS:
                continue
            ups = [
                up
                for up in ((k_down, n_down), (2 * k_down, n_down))
                if count.get(up, 0) >= _LOOP_EXPERTS and up != (n_down, k_down)
            ]
            if ups:
                loop.add((n_down, k_down))
                loop.update(ups)
        if not loop:
            return
        hit = [ev for ev in block if gemm_nk(ev) in loop]
        for ev in hit:
            ev.ktype = _MOE
        retyped += len(hit)
        calls_retyped += sum(count[nk] for nk in loop)
        blocks += 1

    for ev in kernels:
        kt = ev.ktype
        if kt in _BLOCK_END or ev.layer_start:
            if block:
                close(block)
            block = None
        elif kt is _MOE:
            if block is None:
                block = []
        elif block is not None and kt is _GEMM and ev.launch_op in _LOOP_OPS:
            block.append(ev)
    if block:
        close(block)
    return retyped, calls_retyped, blocks


class KernelClassifier:
    """Classifies kernel names with a :class:`PatternSet`, caching the answer per distinct name."""

    def __init__(self, patterns: PatternSet) -> None:
        self.patterns = patterns
        self._cache: dict[str, tuple[KernelType, KernelType | None, str | None, bool, bool, bool]] = {}
        self._mla: dict[str, bool] = {}
        self._launch: dict[tuple[str, ...], KernelType | None] = {}

    def is_mla(self, name: str) -> bool:
        """The kernel belongs to multi-head latent attention (cached per name)."""
        hit = self._mla.get(name)
        if hit is None:
            hit = self._mla[name] = self.patterns.is_mla(name)
        return hit

    def lookup(self, name: str) -> tuple[KernelType, KernelType | None, str | None, bool, bool, bool]:
        """(type, type outside layers, stage vote, extra layer-start marker, extra FFN marker, type fixed
        against launch rules) of a name."""
        hit = self._cache.get(name)
        if hit is None:
            ps = self.patterns
            kt, outside, fixed = ps.name_type(name)
            hit = (
                kt,
                outside,
                ps.stage_vote(name),
                ps.is_layer_start(name),
                ps.is_ffn(name),
                fixed,
            )
            self._cache[name] = hit
        return hit

    def outside_type(self, name: str) -> KernelType | None:
        """The type a kernel takes when it lies outside every layer, if its rule gives one."""
        return self.lookup(name)[1]

    def is_ffn(self, name: str) -> bool:
        """An extra FFN marker from ``[layers] ffn``."""
        return self.lookup(name)[4]

    def launch_type(self, stack: tuple[str, ...]) -> KernelType | None:
        """The type the launching CPU ops give (cached per op stack)."""
        try:
            return self._launch[stack]
        except KeyError:
            kt = self._launch[stack] = self.patterns.launch_type(stack)
            return kt

    def classify(self, gpu: list[GpuEvent], host: Sequence[HostEvent] = ()) -> list[str]:
        """Set ``ktype``, ``vote`` and ``layer_start`` on every event (sorted by start time); the notes on
        what the typing assumed.

        The kernel's name decides, unless the CPU op that launched it says otherwise (``[[launch]]`` rules;
        communication kernels and those of a ``fixed`` name rule, copies, keep their type), or the GEMM was
        launched inside an MoE experts scope of ``host`` (:func:`expert_scopes`); then eager attention
        (batched GEMM, softmax, batched GEMM), sequences (an unfused RMSNorm), the expert GEMMs of MoE
        blocks that batched GEMM ops run (:func:`expert_gemms`) and eager per-expert loops of unbatched
        GEMMs (:func:`expert_loops`) are found in each stream's kernel order."""
        launch = self.launch_type
        for ev in gpu:
            if ev.kind != "kernel":
                ev.ktype = _MEMORY
                continue
            kt, _, vote, start, _, fixed = self.lookup(ev.name)
            if ev.launch_stack and kt is not _COMM and not fixed:
                by_op = launch(ev.launch_stack)
                if by_op is not None:
                    kt = by_op
                elif kt is _UNKNOWN:
                    kt = aten_fallback(ev.launch_stack[0])
            ev.ktype = kt
            ev.vote = vote
            ev.layer_start = start
        notes = expert_scopes(gpu, host, self.patterns) if host else []
        by_stream: dict[tuple[int, int], list[GpuEvent]] = defaultdict(list)
        for ev in gpu:
            if ev.kind == "kernel":
                by_stream[(ev.device, ev.stream)].append(ev)
        for kernels in by_stream.values():
            eager_attention(kernels)
        if self.patterns.sequences:
            for kernels in by_stream.values():
                self._sequences(kernels)
        retyped = calls = blocks = 0
        for kernels in by_stream.values():  # after the sequences: their norms end MoE blocks
            expert_gemms(kernels)
            r, c, b = expert_loops(kernels)
            retyped, calls, blocks = retyped + r, calls + c, blocks + b
        if retyped:
            notes.append(
                f"{retyped} GEMM kernels ({calls} calls) in {blocks} MoE blocks {EXPERT_NOTE_MARK}: after the "
                "router, an up and a down projection shape (n, k) each repeat once per expert that received "
                "tokens (an eager per-expert loop, found from the ops' input shapes)"
            )
        return notes

    def _sequences(self, kernels: list[GpuEvent]) -> None:
        match_cache: dict[tuple[int, int, str], bool] = {}

        def hit(r: int, s: int, name: str) -> bool:
            key = (r, s, name)
            v = match_cache.get(key)
            if v is None:
                v = self.patterns.sequences[r].steps[s].search(name) is not None
                match_cache[key] = v
            return v

        n = len(kernels)
        i = 0
        while i < n:
            matched = 0
            for r, rule in enumerate(self.patterns.sequences):
                if not hit(r, 0, kernels[i].name):
                    continue
                j = i + 1
                ok = True
                for s in range(1, len(rule.steps)):
                    if j < n and hit(r, s, kernels[j].name):
                        j += 1
                    elif not rule.optional[s]:
                        ok = False
                        break
                if ok:
                    for ev in kernels[i:j]:
                        ev.ktype = rule.ktype
                    if rule.layer_start:
                        kernels[i].layer_start = True
                    matched = j - i
                    break
            i += matched or 1
