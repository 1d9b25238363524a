"""Kernel classification: type, stage vote and layer-start marker of every device event."""

from __future__ import annotations

from collections import defaultdict

from opgraph.trace.events import GpuEvent
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
"""Kernels after the softmax (cast, dropout, slicing copies) before the value GEMM."""
_REACH_BEFORE = 6
"""Kernels between the score GEMM and the softmax: scale, mask, soft-cap, and the attention-sink steps
(``cat`` of the sink logits, their row ``max``, ``sub``) that gpt-oss's eager attention adds."""
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
    n = len(kernels)
    for i, ev in enumerate(kernels):
        if not _is_softmax(ev):
            continue
        lo = hi = None
        for j in range(i - 1, max(i - 1 - _REACH_BEFORE, -1), -1):
            k = kernels[j]
            if _batched(k):
                lo = j
                break
            if k.ktype not in _BETWEEN and not (k.ktype is KernelType.REDUCTION and k.launch_op in _ROW_MAX_OPS):
                break
        if lo is None:
            continue
        for j in range(i + 1, min(i + 1 + _REACH, n)):
            k = kernels[j]
            if _batched(k):
                hi = j
                break
            if k.ktype not in _BETWEEN:
                break
        if hi is None:
            continue
        for k in kernels[lo : hi + 1]:
            k.ktype = _ATTENTION


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

    def classify(self, gpu: list[GpuEvent]) -> None:
        """Set ``ktype``, ``vote`` and ``layer_start`` on every event (sorted by start time).

        The kernel's name decides, unless the CPU op that launched it says otherwise (``[[launch]]`` rules;
        communication kernels and those of a ``fixed`` name rule, copies, keep their type); then eager
        attention (batched GEMM, softmax, batched GEMM), sequences (an unfused RMSNorm) and the expert GEMMs
        of MoE blocks that batched GEMM ops run (:func:`expert_gemms`) are found in each stream's kernel
        order."""
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
        by_stream: dict[tuple[int, int], list[GpuEvent]] = defaultdict(list)
        for ev in gpu:
            if ev.kind == "kernel":
                by_stream[(ev.device, ev.stream)].append(ev)
        for kernels in by_stream.values():
            eager_attention(kernels)
        if self.patterns.sequences:
            for kernels in by_stream.values():
                self._sequences(kernels)
        for kernels in by_stream.values():  # after the sequences: their norms end MoE blocks
            expert_gemms(kernels)

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
