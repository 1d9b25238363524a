"""Kernel pattern tables: TOML data files per model family that users extend without touching code.

Built-in files live in ``opgraph/trace/patterns/``. A user adds rules with ``--patterns FILE`` (or a
folder), or by dropping ``*.toml`` files into ``$OPGRAPH_PATTERNS_DIR`` or ``~/.config/opgraph/patterns``;
user files default to priority 100 and so are consulted before the built-ins. The format is described
at the top of ``patterns/generic.toml``.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from opgraph.ir.errors import OpgraphError

# The kernel types are span categories of the IR (a measured kernel's span carries its type); the
# classifier's rules name them. Re-exported here, where the pattern tables and the trace facade use it.
from opgraph.ir.timeline import KernelType as KernelType


class PatternError(OpgraphError):
    """A pattern file is missing, not TOML, or holds an invalid rule."""


_USER_PRIORITY = 100
_STAGES = ("prefill", "decode", "mixed", "idle")


@dataclass(frozen=True)
class TypeRule:
    """Kernel names matching ``regex`` are of ``ktype`` (``outside_layer`` when outside every layer); a
    ``fixed`` rule's type holds whatever CPU op launched the kernel (no ``[[launch]]`` rule retypes it)."""

    ktype: KernelType
    regex: re.Pattern[str]
    outside_layer: KernelType | None
    origin: str
    fixed: bool = False


@dataclass(frozen=True)
class LaunchRule:
    """Kernels launched inside a CPU op whose name matches ``regex`` are of ``ktype``."""

    ktype: KernelType
    regex: re.Pattern[str]
    origin: str


@dataclass(frozen=True)
class SequenceRule:
    """Consecutive kernels matching ``steps`` (``optional`` ones may be absent) form one ``ktype`` unit."""

    ktype: KernelType
    steps: tuple[re.Pattern[str], ...]
    optional: tuple[bool, ...]
    layer_start: bool
    origin: str


@dataclass(frozen=True)
class StepRule:
    """A user annotation naming one engine step; ``labels`` map the ``label`` group to a stage."""

    regex: re.Pattern[str]
    labels: dict[str, str]
    origin: str


@dataclass
class PatternSet:
    """All rules, in the order they are consulted (highest priority first)."""

    type_rules: list[TypeRule] = field(default_factory=list)
    launch_rules: list[LaunchRule] = field(default_factory=list)
    stage_rules: list[tuple[str, re.Pattern[str]]] = field(default_factory=list)
    sequences: list[SequenceRule] = field(default_factory=list)
    steps: list[StepRule] = field(default_factory=list)
    simplify: list[tuple[re.Pattern[str], str]] = field(default_factory=list)
    layer_start: list[re.Pattern[str]] = field(default_factory=list)
    ffn: list[re.Pattern[str]] = field(default_factory=list)
    mla: list[re.Pattern[str]] = field(default_factory=list)
    experts: list[re.Pattern[str]] = field(default_factory=list)
    """Host scopes (user annotations, ``nn.Module`` Python events) whose GEMMs run MoE experts."""
    families: list[str] = field(default_factory=list)
    """Families loaded, in consultation order."""
    files: list[str] = field(default_factory=list)

    def kernel_type(self, name: str) -> tuple[KernelType, KernelType | None]:
        """Type of a kernel name, and its type outside layers when a rule gives one (see :meth:`name_type`)."""
        kt, outside, _ = self.name_type(name)
        return kt, outside

    def name_type(self, name: str) -> tuple[KernelType, KernelType | None, bool]:
        """Type of a kernel name, its type outside layers when a rule gives one, and whether the name fixes
        the type (a ``fixed`` rule: no ``[[launch]]`` rule overrides it).

        Rules see the kernel's name without its argument list (:func:`core_name`): argument types
        (``flashinfer::QuantizationSFLayout``) say nothing about what the kernel computes. Built-in
        rules give way to what inductor's fused-kernel names spell out (:func:`inductor_type`); user
        rules come first.
        """
        core = core_name(name)
        inductor: KernelType | None = None
        inductor_done = False
        for rule in self.type_rules:
            if not inductor_done and rule.origin.startswith(BUILTIN_ORIGIN):
                inductor, inductor_done = inductor_type(core), True
                if inductor is not None:
                    return inductor, None, False
            if rule.regex.search(core):
                return rule.ktype, rule.outside_layer, rule.fixed
        if not inductor_done:
            inductor = inductor_type(core)
            if inductor is not None:
                return inductor, None, False
        return KernelType.UNKNOWN, None, False

    def launch_type(self, ops: Sequence[str]) -> KernelType | None:
        """The type that the launching CPU ops give a kernel (``ops`` innermost first): the outermost op
        matching a ``[[launch]]`` rule decides (``vllm::moe_forward`` around ``aten::mm`` is MoE). Kernels
        whose name a ``fixed`` rule types keep that type (:meth:`name_type`): the copy that ``aten::matmul``
        makes of a strided input is a copy, not GEMM work. The host range inductor opens around each
        fused Triton kernel's launch is skipped: it is the kernel's own name (``triton_poi_fused_..._sin_``
        ``..._scaled_dot_product_cudnn_attention_..._3``), which lists the ops that the kernel's outputs
        feed, not a CPU op that ran it (:func:`inductor_type` reads it)."""
        for op in reversed(ops):
            if is_inductor_kernel(op):  # inductor's range around its own kernel: the name rules read it
                continue
            for rule in self.launch_rules:
                if rule.regex.search(op):
                    return rule.ktype
        return None

    def stage_vote(self, name: str) -> str | None:
        """``prefill`` or ``decode`` when the name says so."""
        for stage, rx in self.stage_rules:
            if rx.search(name):
                return stage
        return None

    def short_name(self, name: str) -> str:
        """A short display name: the first ``[[simplify]]`` rule that matches, else a trimmed name."""
        for rx, repl in self.simplify:
            m = rx.search(name)
            if m:
                return m.expand(repl)
        base = name[5:] if name.startswith("void ") else name
        if "at::native::" in base:
            return _aten_short(base)
        cut = base.find("(")
        if cut > 0:
            base = base[:cut]
        lt = base.find("<")
        if lt > 0:
            base = base[:lt]
        return base[:80]

    def is_mla(self, name: str) -> bool:
        """The kernel belongs to multi-head latent attention."""
        return any(rx.search(name) for rx in self.mla)

    def is_layer_start(self, name: str) -> bool:
        """An extra layer-start marker (norm-type kernels are markers already)."""
        return any(rx.search(name) for rx in self.layer_start)

    def is_ffn(self, name: str) -> bool:
        """An extra FFN marker (activation- and MoE-type kernels are markers already)."""
        return any(rx.search(name) for rx in self.ffn)

    def is_experts_scope(self, name: str) -> bool:
        """A host scope (a module's annotation) that runs MoE experts: the GEMMs launched inside it are MoE."""
        return any(rx.search(name) for rx in self.experts)


BUILTIN_ORIGIN = "builtin:"
"""Origin prefix of the built-in pattern files."""


def core_name(name: str) -> str:
    """A kernel name without ``void``, anonymous namespaces and its argument list: what it is, not what
    it takes. Template arguments stay (ATen's functors say what an elementwise kernel computes)."""
    s = name[5:] if name.startswith("void ") else name
    if "(anonymous namespace)::" in s:
        s = s.replace("(anonymous namespace)::", "")
    end = len(s.rstrip())
    if end and s[end - 1] == ")":
        depth = 0
        for i in range(end - 1, -1, -1):
            c = s[i]
            if c == ")":
                depth += 1
            elif c == "(":
                depth -= 1
                if depth == 0:
                    if i > 0:
                        s = s[:i]
                    break
    return s


_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for)_fused_(.*?)(?:_\d+)?$")
_INDUCTOR_MEMORY = frozenset(
    {
        "to",
        "copy",
        "clone",
        "cat",
        "view",
        "slice",
        "select",
        "index",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "expand",
        "constant",
        "pad",
        "zeros",
        "full",
        "fill",
        "new",
        "empty",
        "like",
        "scatter",
        "gather",
        "stack",
        "split",
        "with",
        "sizes",
        "as",
        "strided",
        "t",
        "reshape",
        "unsafe",
        "lift",
        "fresh",
        "alias",
        "detach",
        "scalar",
        "tensor",
        "put",
        "embedding",
        "cache",
        "repeat",
    }
)

_INDUCTOR_CONSUMERS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "scaled", "dot", "product", "attention", "cudnn", "flash", "efficient", "flex"}
)
"""Words of the matmul and attention ops (``bmm``, ``_scaled_dot_product_cudnn_attention``) in a pointwise or
reduction kernel's name: ops whose inputs the kernel prepares (an extern kernel runs them), not what it
computes."""


def is_inductor_kernel(name: str) -> bool:
    """``name`` is an inductor (torch.compile) fused Triton kernel's: ``triton_poi_fused_add_0``.

    Inductor also opens a host range of that name around each launch; it names the kernel, not a CPU
    op that says what the kernel computes (see :meth:`PatternSet.launch_type`)."""
    return _INDUCTOR.match(name) is not None


def inductor_type(core: str) -> KernelType | None:
    """The type of a torch.compile (inductor) fused kernel from the ops its name lists, or None for other
    names. ``triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0`` is an RMSNorm, not a copy.

    The name lists every op of the FX nodes fused into the kernel, including the ones whose inputs it
    only prepares: RoPE's ``cos``/``sin``/``neg``/``cat`` fused into the producer of an ``mm``'s or a
    ``_scaled_dot_product_cudnn_attention``'s input carries ``bmm`` and ``attention`` in its name. Only a
    template kernel (``triton_tem_``) runs a matmul; the matmuls and attention of a compiled graph are
    otherwise extern kernels (cuBLAS, cuDNN, flash), so a pointwise or reduction kernel (``poi``, ``red``,
    ``per``) is typed by what it computes, never as a GEMM or by the attention op it feeds.

    >>> inductor_type("triton_poi_fused__to_copy_add_bmm_cat_cos_mul_neg_sin_slice_transpose_2").value
    'rope'
    >>> inductor_type("triton_tem_fused_addmm_7").value
    'gemm'
    """
    m = _INDUCTOR.match(core)
    if m is None:
        return None
    kind, body = m.group(1), m.group(2)
    ops = {w for w in body.split("_") if w and not w.isdigit()}
    if "moe" in ops or "experts" in ops:  # fused into a custom MoE op (vllm::moe_forward)
        return KernelType.MOE
    if kind == "tem":
        return KernelType.GEMM
    if ("rsqrt" in ops and ops & {"mean", "var", "sum"}) or "norm" in ops:
        return KernelType.NORM
    if ops & {"softmax", "amax"} and ops & {"exp", "softmax"}:
        # a fused softmax: attention's (a decomposed math SDPA) when the name says so, as eager attention's
        # softmax between its batched GEMMs is typed attention
        return KernelType.ATTENTION if "attention" in ops else KernelType.ACTIVATION
    ops -= _INDUCTOR_CONSUMERS
    if ops & {"silu", "gelu", "relu", "sigmoid", "tanh", "swiglu"}:
        return KernelType.ACTIVATION
    if "embedding" in ops and len(ops - _INDUCTOR_MEMORY) == 0:
        return KernelType.EMBEDDING
    if {"cos", "sin"} <= ops or "rotary" in ops or ("neg" in ops and "cat" in ops and ("mul" in ops or "slice" in ops)):
        return KernelType.ROPE
    if ops & {"argmax", "multinomial", "exponential"}:
        return KernelType.SAMPLING
    if ops & {"topk", "sort"}:
        return KernelType.REDUCTION
    if ops and ops <= _INDUCTOR_MEMORY:
        return KernelType.MEMORY
    return KernelType.REDUCTION if kind in ("red", "per") else KernelType.ELEMENTWISE


_ATEN_PART = re.compile(r"(\w+(?:Functor\w*|_kernel_cuda|_kernel_impl|Ops|_kernel\w*|Copy\w*|TopK|InPlace))")
_ATEN_GENERIC = frozenset(
    {
        "BinaryFunctor",
        "AUnaryFunctor",
        "BUnaryFunctor",
        "UnaryFunctor",
        "gpu_kernel_impl",
        "gpu_kernel_impl_nocast",
        "func_wrapper_t",
    }
)


def _aten_short(base: str) -> str:
    """``vectorized_elementwise_kernel: rsqrt_kernel_cuda`` from a templated ATen kernel name."""
    head = base.replace("(anonymous namespace)::", "").split("(", 1)[0]
    lt = head.find("<")
    kernel = (head[:lt] if lt > 0 else head).rsplit("::", 1)[-1]
    parts = [m for m in _ATEN_PART.findall(head[lt:] if lt > 0 else "") if m not in _ATEN_GENERIC and m != kernel]
    return f"{kernel}: {parts[-1] if parts else ''}".rstrip(": ")[:80] if parts else kernel[:80]


def _compile(rx: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(rx, re.IGNORECASE)
    except re.error as exc:
        raise PatternError(f"invalid regex {rx!r}: {exc}", where=where) from None


def _strs(value: Any, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PatternError(f"'{key}' must be a string or a list of strings", where=where)
    return list(value)


def _ktype(value: Any, where: str) -> KernelType:
    try:
        return KernelType(str(value))
    except ValueError:
        kinds = ", ".join(k.value for k in KernelType)
        raise PatternError(f"unknown kernel type {value!r}", where=where, hint=f"use one of {kinds}") from None


def _parse_file(text: str, origin: str) -> tuple[int, dict[str, Any]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PatternError(f"not valid TOML: {exc}", where=origin) from None
    prio = data.get("priority", 0)
    if not isinstance(prio, int):
        raise PatternError("'priority' must be an integer", where=origin)
    return prio, data


def _add(ps: PatternSet, data: dict[str, Any], origin: str) -> None:
    known = {"family", "priority", "type", "launch", "stage", "sequence", "step", "simplify", "layers"}
    extra = set(data) - known
    if extra:
        raise PatternError(f"unknown key(s) {', '.join(sorted(extra))}", where=origin, hint=f"known: {sorted(known)}")
    ps.families.append(str(data.get("family", Path(origin).stem)))
    ps.files.append(origin)
    for i, rule in enumerate(data.get("type", [])):
        where = f"{origin} [[type]] #{i + 1}"
        kt = _ktype(rule.get("type"), where)
        out = rule.get("outside_layer")
        fixed = rule.get("fixed", False)
        if not isinstance(fixed, bool):
            raise PatternError("'fixed' must be true or false", where=where)
        for rx in _strs(rule.get("match", []), where, "match"):
            ps.type_rules.append(
                TypeRule(kt, _compile(rx, where), _ktype(out, where) if out is not None else None, origin, fixed)
            )
    for i, rule in enumerate(data.get("launch", [])):
        where = f"{origin} [[launch]] #{i + 1}"
        kt = _ktype(rule.get("type"), where)
        for rx in _strs(rule.get("match", []), where, "match"):
            ps.launch_rules.append(LaunchRule(kt, _compile(rx, where), origin))
    for i, rule in enumerate(data.get("stage", [])):
        where = f"{origin} [[stage]] #{i + 1}"
        stage = rule.get("stage")
        if stage not in ("prefill", "decode"):
            raise PatternError(f"stage must be 'prefill' or 'decode', got {stage!r}", where=where)
        for rx in _strs(rule.get("match", []), where, "match"):
            ps.stage_rules.append((stage, _compile(rx, where)))
    for i, rule in enumerate(data.get("sequence", [])):
        where = f"{origin} [[sequence]] #{i + 1}"
        steps = _strs(rule.get("steps", []), where, "steps")
        if not steps or steps[0].startswith("?"):
            raise PatternError("a sequence needs steps, the first one required", where=where)
        ps.sequences.append(
            SequenceRule(
                _ktype(rule.get("type", "norm"), where),
                tuple(_compile(s.lstrip("?"), where) for s in steps),
                tuple(s.startswith("?") for s in steps),
                bool(rule.get("layer_start", False)),
                origin,
            )
        )
    for i, rule in enumerate(data.get("step", [])):
        where = f"{origin} [[step]] #{i + 1}"
        labels = rule.get("labels", {})
        if not isinstance(labels, dict) or any(v not in _STAGES for v in labels.values()):
            raise PatternError(f"step labels must map to one of {_STAGES}", where=where)
        rx = rule.get("match")
        if not isinstance(rx, str):
            raise PatternError("a step rule needs a 'match' regex", where=where)
        try:
            compiled = re.compile(rx)
        except re.error as exc:
            raise PatternError(f"invalid regex {rx!r}: {exc}", where=where) from None
        ps.steps.append(StepRule(compiled, {str(k): str(v) for k, v in labels.items()}, origin))
    for i, rule in enumerate(data.get("simplify", [])):
        where = f"{origin} [[simplify]] #{i + 1}"
        if not isinstance(rule.get("name"), str) or not isinstance(rule.get("match"), str):
            raise PatternError("a simplify rule needs 'match' and 'name' strings", where=where)
        ps.simplify.append((_compile(rule["match"], where), rule["name"]))
    layers = data.get("layers", {})
    where = f"{origin} [layers]"
    ps.layer_start += [_compile(rx, where) for rx in _strs(layers.get("start", []), where, "start")]
    ps.ffn += [_compile(rx, where) for rx in _strs(layers.get("ffn", []), where, "ffn")]
    ps.mla += [_compile(rx, where) for rx in _strs(layers.get("mla", []), where, "mla")]
    ps.experts += [_compile(rx, where) for rx in _strs(layers.get("experts", []), where, "experts")]


def builtin_pattern_files() -> list[tuple[str, str]]:
    """(name, text) of the built-in pattern files."""
    root = resources.files("opgraph.trace") / "patterns"
    return sorted((f.name, f.read_text()) for f in root.iterdir() if f.name.endswith(".toml"))


def user_pattern_paths() -> list[Path]:
    """Pattern files found in ``$OPGRAPH_PATTERNS_DIR`` and ``~/.config/opgraph/patterns``."""
    dirs = []
    env = os.environ.get("OPGRAPH_PATTERNS_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(Path.home() / ".config" / "opgraph" / "patterns")
    out: list[Path] = []
    for d in dirs:
        if d.is_dir():
            out += sorted(d.glob("*.toml"))
    return out


def load_patterns(extra: list[str | Path] | tuple[str | Path, ...] = (), *, user_dirs: bool = True) -> PatternSet:
    """Built-in rules plus ``extra`` files or folders (and the user directories), merged by priority."""
    entries: list[tuple[int, int, str, dict[str, Any]]] = []
    for n, (name, text) in enumerate(builtin_pattern_files()):
        prio, data = _parse_file(text, f"opgraph/trace/patterns/{name}")
        entries.append((prio, -n, f"{BUILTIN_ORIGIN}{name}", data))
    paths: list[Path] = []
    for e in extra:
        p = Path(e)
        if p.is_dir():
            paths += sorted(p.glob("*.toml"))
        elif p.is_file():
            paths.append(p)
        else:
            raise PatternError("no such pattern file or folder", where=str(p), hint="pass a .toml file or a folder")
    if user_dirs:
        paths = user_pattern_paths() + paths
    for n, p in enumerate(paths):
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PatternError(f"unreadable ({exc})", where=str(p)) from None
        prio, data = _parse_file(text, str(p))
        if "priority" not in data:
            prio = _USER_PRIORITY
        # later user files win ties: they are consulted first
        entries.append((prio, 1000 + n, str(p), data))
    entries.sort(key=lambda e: (-e[0], -e[1]))
    ps = PatternSet()
    for _, _, origin, data in entries:
        _add(ps, data, origin)
    return ps


def default_patterns() -> PatternSet:
    """The built-in rules plus the user directories."""
    return load_patterns()
