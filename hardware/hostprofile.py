"""Host profiles: the framework's host time between ops on one CPU, as a model of the graph's structure.

An eager PyTorch forward spends host time on two things per kernel: issuing the aten call
(dispatcher and launch, in the device profile as ``aten_issue_us`` and per-regime ``host_s``) and
the framework's Python before it (module calls, ``forward`` bodies, views and cache bookkeeping:
``OpBase.host_gap_us`` of a graph captured with ``--host-timing``). A :class:`HostProfile` holds the
second as medians keyed by where an op sits in the model, fitted from host-timed captures of a
training set of models (:func:`hardware.hostfit.fit_host_profile`), so a graph captured without host
timing (on any machine, on ``meta``) still gets the framework time of the profiled CPU.

Each op is looked up by its :func:`structure_keys`, most specific first:

1. ``exact``: stage, op kind, aten target, module role (the scope with layer numbers as ``*``,
   ``model.layers.*.self_attn.q_proj``) and position (``entry``: the first op of a module call,
   which pays the module's Python; ``inner``: any later op of the same call);
2. ``target``: kind, target and position;
3. ``kind``: kind and position;
4. ``global``: the median over every training op.

Terms fitted from measured walls (:func:`hardware.hostfit.fit_wall_terms`) carry what a ``meta``
capture cannot see: on the real device each op's host time in context (its issue and the framework
before it) is :attr:`HostProfile.op_scale` times what replay and the ``meta`` timing measure alone, and
each forward pass pays :attr:`HostProfile.forward_us` more (the call, HF's preamble and output
wrapping as they run on the device, and what a short forward pays cold) whatever its layer count;
:attr:`HostProfile.busy_scale` (a third term, fitted when the training walls tell it) makes the host
slower in a forward pass whose device is busy a larger share of the time, and
:attr:`HostProfile.nested_scale` (fitted when training graphs hold nested calls, below) scales the
issue time of calls made from C++. :func:`in_context` applies them.

An op issued from C++ inside another aten call (:func:`is_nested`: torch's fallback of ``_grouped_mm``
for fp16/fp32 runs one ``mm`` per expert from one Python-level call) pays no framework time: no Python
runs between it and the call before it. Its issue time is the cost model's (measured for a call from
Python) times :attr:`HostProfile.nested_scale`, fitted on training walls whose graphs hold such calls
(1 without them). Where the profile measured that fallback's loop on this CPU
(:attr:`HostProfile.grouped_fallback`, :class:`FallbackLoop`), the call's products take the measured
times instead (:func:`fallback_issue_us`): the first, which stands for the call, the call's host time
with one expert active; each further one the loop's time per active expert, times
:attr:`HostProfile.nested_scale`. The call copies its offsets to the host before its first product:
the simulator's eager host waits there for the op issued before it (``simulators.api``).

Catalog devices name their host profile in their TOML (``host_profile = "h100-sxm.host.json"``, the
CPU of the machine that measured the device profile); :func:`hardware_host_profile` finds it.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import Field

from hardware.spec import HardwareSpec, NonNegFloat
from hardware.versioned import FileKind
from opgraph.ir import SAMPLER_SCOPE, OpGraph, OpgraphError, save_model
from opgraph.ir.issue import is_nested
from opgraph.ir.ops import OpBase
from opgraph.ir.tensor import FrozenModel

HOST_PROFILE_FORMAT = "opgraph.host_profile"
"""The ``format`` marker of a host profile file."""
HOST_PROFILE_SCHEMA_VERSION: Final = 2
"""The host profile file format version this opgraph writes (it reads version 1 too: version 2 added
:attr:`HostProfile.grouped_fallback`)."""
HOST_PROFILE_SUFFIX = ".host.json"
"""File names ending so are host profiles."""

LEVELS: tuple[str, ...] = ("exact", "target", "kind", "global")
"""Lookup levels of :meth:`HostProfile.gap_us`, most specific first."""

_NUMBER = re.compile(r"^\d+$")


class HostProfileWarning(UserWarning):
    """A host profile that may not describe the host being modelled (another CPU than the device
    profile's host). Front ends print it as one line."""


class HostInfo(FrozenModel):
    """Where and with what a host profile was measured."""

    cpu: str
    """CPU model name (``/proc/cpuinfo``) of the machine the training graphs were timed on."""
    cores: Annotated[int, Field(ge=0)] = 0
    """Logical CPUs of that machine (0: unknown)."""
    torch: str = ""
    """torch version."""
    transformers: str = ""
    """transformers version."""
    python: str = ""
    """Python version."""
    platform: str = ""
    """OS and machine (``platform.platform()``)."""
    date: str = ""
    """When the profile was built (ISO 8601, UTC)."""


class GapStat(FrozenModel):
    """Framework time before the ops of one key: median and spread over the training ops."""

    median_us: NonNegFloat
    """Median framework host time before an op of this key, microseconds."""
    p10_us: NonNegFloat = 0.0
    """10th percentile."""
    p90_us: NonNegFloat = 0.0
    """90th percentile."""
    n: Annotated[int, Field(ge=1)]
    """Training ops with this key."""


class TrainingGraph(FrozenModel):
    """One host-timed capture the profile was fitted from."""

    model: str
    """Model name or preset."""
    architecture: str = ""
    """HF architecture class."""
    phase: str = ""
    """prefill, decode or generate."""
    shape: str = ""
    """Batch, tokens and layers as captured (``b4 kv2048 bf16 3L``)."""
    ops: Annotated[int, Field(ge=0)]
    """Ops with a measured gap."""
    total_us: NonNegFloat
    """Framework host time of the whole graph, microseconds."""


class WallSample(FrozenModel):
    """One measured forward the wall terms were fitted on: the training graph's measured and
    simulated walls."""

    name: str
    """The training case."""
    measured_us: NonNegFloat
    """Median CUDA-synchronised wall of one forward on the device, microseconds."""
    predicted_us: NonNegFloat
    """The simulated wall with the fitted terms."""
    unfitted_us: NonNegFloat = 0.0
    """The simulated wall without them (op scale 1, no forward time)."""


class FallbackLoop(FrozenModel):
    """Host time of torch's C++ fallback of ``_grouped_mm`` (fp16, fp32: one ``mm`` per expert that
    received rows) on this CPU for one expert shape, the device idle before each call: a call with ``a``
    experts active takes ``first_us + (a - 1) * per_expert_us`` (a line fitted over calls with several
    expert loads, ``benchmarks/gpu/grouped_fallback_host.py``)."""

    experts: Annotated[int, Field(ge=1)]
    """Experts of the layer (the loop visits each, idle or not)."""
    n: Annotated[int, Field(ge=1)]
    """Output features of each expert's product."""
    k: Annotated[int, Field(ge=1)]
    """Input features of each expert's product."""
    first_us: NonNegFloat
    """The call with one expert active: its Python-level call, the offsets copied to the host (a sync
    on an idle device), the idle experts' loop steps and the one product."""
    per_expert_us: NonNegFloat
    """Each further active expert: its loop step and its ``mm``'s dispatch and launch."""
    calls: Annotated[int, Field(ge=2)]
    """Expert loads the line was fitted over."""


class HostProfile(FrozenModel):
    """The framework's host time between ops on one CPU, keyed by the op's place in the model."""

    format: Literal["opgraph.host_profile"] = "opgraph.host_profile"
    """Marks the file as a host profile."""
    schema_version: Literal[1, 2] = HOST_PROFILE_SCHEMA_VERSION
    """Format version (:data:`HOST_PROFILE_SCHEMA_VERSION`; 1, without :attr:`grouped_fallback`, still reads)."""
    host: HostInfo
    """Provenance: the CPU and software."""
    issue_us: NonNegFloat | None = None
    """Host time to issue one aten call in eager PyTorch on this CPU (dispatcher and launch), when
    known; the device profile's per-regime issue times take precedence where it has them."""
    issue_source: str = ""
    """Where :attr:`issue_us` came from (``device profile h100-sxm.profile.json``)."""
    exact: dict[str, GapStat] = Field(default_factory=dict)
    """``stage|kind|target|role|position`` -> framework time."""
    target: dict[str, GapStat] = Field(default_factory=dict)
    """``kind|target|position`` -> framework time."""
    kind: dict[str, GapStat] = Field(default_factory=dict)
    """``kind|position`` -> framework time."""
    global_gap: GapStat
    """Over every training op."""
    forward_us: NonNegFloat = 0.0
    """Host time per forward pass that no op's gap holds, on the real device (fitted from measured
    walls; 0 when the profile was fitted without them)."""
    op_scale: Annotated[float, Field(gt=0)] = 1.0
    """Each op's host time in context on the real device over its issue time plus framework time as
    measured alone (fitted from measured walls; 1 without them)."""
    nested_scale: Annotated[float, Field(gt=0)] = 1.0
    """Host time in context of an op issued from C++ inside the call before it (:func:`is_nested`) over
    its issue time: the measured loop's time per expert (:attr:`grouped_fallback`) where the profile has
    it, else the cost model's issue time of the same op called from Python, which includes a Python
    binding and argument parsing it does not pay (fitted from measured walls of graphs holding such ops;
    1 without them)."""
    busy_scale: NonNegFloat = 0.0
    """How much slower the host runs while the device is busy: each op's host time in a forward pass
    whose device time is a share ``u = min(1, device / host)`` of its host time is ``1 + busy_scale * u``
    times longer (fitted from measured walls; 0 without them)."""
    generate_step_us: NonNegFloat = 0.0
    """Host time per step of transformers' ``generate`` loop that no op's gap holds: its Python around
    the calls the capture records between two forward passes (the next step's inputs prepared, the
    stopping criteria run, the stop flag checked). On the first op of each step's sampler (fitted from
    measured generates of other models and shapes; 0 without them)."""
    generate_setup_us: NonNegFloat = 0.0
    """Host time of ``generate``'s preamble before the prompt's forward pass (its checks and set-up), on
    the first op of a generate graph (fitted with :attr:`generate_step_us`)."""
    grouped_fallback: tuple[FallbackLoop, ...] = ()
    """The host time of torch's ``_grouped_mm`` fallback on this CPU, by expert shape (measured; empty:
    its products take the cost model's issue time, :attr:`nested_scale` for the nested ones)."""
    walls: tuple[WallSample, ...] = ()
    """The measured forwards :attr:`forward_us` and :attr:`op_scale` were fitted on."""
    training: tuple[TrainingGraph, ...] = ()
    """The captures it was fitted from."""
    notes: tuple[str, ...] = ()
    """Remarks (what was left out of the training set, and why)."""

    def gap_us(self, keys: Sequence[str]) -> tuple[float, str]:
        """The framework time for an op with :func:`structure_keys` ``keys``: (us, level used)."""
        for level, key in zip(LEVELS, keys, strict=False):
            table: dict[str, GapStat] = getattr(self, level)
            hit = table.get(key)
            if hit is not None:
                return hit.median_us, level
        return self.global_gap.median_us, "global"

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON, atomically."""
        return save_model(self, path)


def module_role(scope: str) -> str:
    """The scope with numeric path parts (layer, expert indices) as ``*``.

    >>> module_role("model.layers.12.self_attn.q_proj")
    'model.layers.*.self_attn.q_proj'
    """
    return ".".join("*" if _NUMBER.match(part) else part for part in scope.split(".")) if scope else ""


def structure_keys(op: OpBase, previous_scope: str | None) -> tuple[str, str, str]:
    """The (exact, target, kind) lookup keys of ``op``; ``previous_scope`` is the scope of the op
    issued before it (``None`` for the first op: an entry)."""
    position = "entry" if previous_scope is None or op.scope != previous_scope else "inner"
    kind = op.kind.value
    stage = op.stage.value if op.stage is not None else ""
    return (
        f"{stage}|{kind}|{op.target}|{module_role(op.scope)}|{position}",
        f"{kind}|{op.target}|{position}",
        f"{kind}|{position}",
    )


def graph_keys(graph: OpGraph) -> list[tuple[str, str, str]]:
    """:func:`structure_keys` of every op of ``graph``, in program order."""
    out: list[tuple[str, str, str]] = []
    previous: str | None = None
    for op in graph.ops:
        out.append(structure_keys(op, previous))
        previous = op.scope
    return out


@dataclass(frozen=True)
class GapPrediction:
    """Framework host time per op of a graph, looked up in a host profile."""

    gaps_us: list[float]
    """Per op, in program order."""
    levels: Counter[str] = field(default_factory=Counter)
    """Ops answered at each lookup level (and ``nested``: ops that run nested in a call, no framework time)."""

    @property
    def total_us(self) -> float:
        """Sum over ops."""
        return sum(self.gaps_us)

    def describe(self) -> str:
        """``N exact, M kind+target, ...`` in lookup order."""
        names = {
            "exact": "exact key",
            "target": "kind+target",
            "kind": "kind only",
            "global": "global median",
            "nested": "nested in a call (none)",
        }
        return ", ".join(f"{self.levels[lv]} {names[lv]}" for lv in (*LEVELS, "nested") if self.levels[lv])


def predict_gaps(graph: OpGraph, profile: HostProfile) -> GapPrediction:
    """The framework time before each op of ``graph`` on the profile's CPU (fallback chain of
    :data:`LEVELS`); none before an op that runs nested in the call before it (:func:`is_nested`,
    counted at level ``nested``)."""
    gaps: list[float] = []
    levels: Counter[str] = Counter()
    for op, keys in zip(graph.ops, graph_keys(graph), strict=True):
        if is_nested(op):
            gaps.append(0.0)
            levels["nested"] += 1
            continue
        us, level = profile.gap_us(keys)
        gaps.append(us)
        levels[level] += 1
    return GapPrediction(gaps, levels)


def forward_starts(graph: OpGraph) -> list[int]:
    """Indices of the ops that start a forward pass: the first op, and each op whose (stage, step)
    differs from the op before it (the steps of a generate graph)."""
    out: list[int] = []
    previous: tuple[object, object] | None = None
    for i, op in enumerate(graph.ops):
        here = (op.stage, op.step)
        if i == 0 or here != previous:
            out.append(i)
        previous = here
    return out


def fallback_issue_us(profile: HostProfile, op: OpBase) -> float | None:
    """The host time the profile measured for ``op`` when it is a product of torch's ``_grouped_mm``
    fallback (an expert GEMM issued as :attr:`~opgraph.ir.HostIssue.SYNC`, the call's first product, or
    :attr:`~opgraph.ir.HostIssue.NESTED`, a further one), from the measured loop of the nearest expert
    shape (the same expert count first, then the nearest ``n`` and ``k`` in log space); ``None`` for any
    other op or when the profile measured no loop.

    >>> from opgraph.ir import ExpertGemm, Gemm, HostIssue
    >>> loop = FallbackLoop(experts=8, n=64, k=32, first_us=40.0, per_expert_us=15.0, calls=3)
    >>> prof = HostProfile(host=HostInfo(cpu="x"), global_gap=GapStat(median_us=1.0, n=1), grouped_fallback=(loop,))
    >>> expert = ExpertGemm(impl="grouped_mm", experts=8, top_k=2, part="gate_up")
    >>> first = Gemm(id=0, m=4, n=64, k=32, expert=expert, issue=HostIssue.SYNC)
    >>> fallback_issue_us(prof, first), fallback_issue_us(prof, first.model_copy(update={"issue": "nested"}))
    (40.0, 15.0)
    """
    from opgraph.ir import Gemm, HostIssue

    if not profile.grouped_fallback or not isinstance(op, Gemm) or op.expert is None:
        return None
    if op.issue not in (HostIssue.SYNC, HostIssue.NESTED):
        return None
    experts = op.expert.experts

    def distance(loop: FallbackLoop) -> tuple[bool, float]:
        shape = abs(math.log(loop.n / op.n)) + abs(math.log(loop.k / op.k)) if op.n and op.k else 0.0
        return loop.experts != experts, shape + abs(math.log(loop.experts / max(experts, 1)))

    loop = min(profile.grouped_fallback, key=distance)
    return loop.first_us if op.issue is HostIssue.SYNC else loop.per_expert_us


def in_generate_loop(host_us: Sequence[float], graph: OpGraph, profile: HostProfile) -> list[float]:
    """``host_us`` with the host profile's generate-loop terms added: :attr:`HostProfile.generate_step_us`
    on the first op of each step's sampler (the ops recorded in the ``sampler`` scope), and
    :attr:`HostProfile.generate_setup_us` on the first op when the graph holds the prompt's step 0."""
    out = list(host_us)
    if not out:
        return out
    seen: set[object] = set()
    for i, op in enumerate(graph.ops):
        if op.scope == SAMPLER_SCOPE and op.step not in seen:
            seen.add(op.step)
            out[i] += profile.generate_step_us
    if graph.ops[0].step == 0:
        out[0] += profile.generate_setup_us
    return out


def in_context(
    host_us: Sequence[float], graph: OpGraph, profile: HostProfile, device_us: Sequence[float] | None = None
) -> list[float]:
    """Per-op host times (issue plus framework time, in program order) as the real device runs them:
    each times :attr:`HostProfile.op_scale` (and ``1 + busy_scale * u`` with the forward pass's device
    share ``u`` when ``device_us``, each op's device time, is given), plus :attr:`HostProfile.forward_us`
    on the first op of each forward pass (:func:`forward_starts`).

    An op nested in the call before it (:func:`is_nested`) takes :attr:`HostProfile.nested_scale`
    instead: the other terms describe a Python-level call issued among the framework's Python (cold
    caches), and a C++ loop issues its calls back to back without Python."""
    nested = [is_nested(op) for op in graph.ops]
    out = [h * (profile.nested_scale if n else profile.op_scale) for h, n in zip(host_us, nested, strict=True)]
    if not out:  # a graph of no ops: no forward pass to charge
        return out
    starts = forward_starts(graph)
    if profile.busy_scale and device_us is not None:
        for a, b in zip(starts, [*starts[1:], len(out)], strict=True):
            host, device = sum(host_us[a:b]), sum(device_us[a:b])
            u = min(1.0, device / host) if host > 0 else 0.0
            scale = 1 + profile.busy_scale * u
            out[a:b] = [h if n else h * scale for h, n in zip(out[a:b], nested[a:b], strict=True)]
    if profile.forward_us:
        for i in starts:
            out[i] += profile.forward_us
    return out


# -- files -------------------------------------------------------------------------------------------


HOST_PROFILE_FILE = FileKind(
    "host profile",
    HOST_PROFILE_FORMAT,
    HOST_PROFILE_SCHEMA_VERSION,
    "python -m hardware.hostfit",
    "rebuild it with `python -m hardware.hostfit`",
)
"""How a host profile file is checked and read."""


def load_host_profile(path: str | Path) -> HostProfile:
    """Read a :class:`HostProfile`; a missing, truncated, foreign or other-version file is a one-line
    :class:`~opgraph.ir.LoadError` naming it (:class:`~opgraph.ir.SchemaVersionError` for the version)."""
    return HOST_PROFILE_FILE.load(path, HostProfile)


def hardware_host_profile(hw: HardwareSpec | str) -> Path | None:
    """The host profile file the device's TOML names (``host_profile = ...``), or ``None``.

    >>> hardware_host_profile("a6000") is None
    True
    """
    from hardware.loader import catalog_spec, list_hardware, named_host_profile

    list_hardware()  # the catalog registers its profiles as it loads (once)
    name = hw.name if isinstance(hw, HardwareSpec) else hw
    hit = named_host_profile(name)  # a user TOML's own registers under its name as it loads
    return hit if hit is not None or isinstance(hw, HardwareSpec) else named_host_profile(catalog_spec(hw).name)


@lru_cache(maxsize=32)
def device_host_cpu(hw_name: str) -> str | None:
    """The host CPU the device's shipped device profile was measured with, when it ships one."""
    from hardware.profile import hardware_profile, load_profile

    try:
        path = hardware_profile(hw_name)
    except OpgraphError:  # not a catalog device: it ships no device profile
        return None
    if path is None or not path.exists():
        return None
    return load_profile(path).device.host_cpu or None


def check_host_cpu(profile: HostProfile, hw_name: str, where: str) -> str | None:
    """A :class:`HostProfileWarning` (returned as its text too) when the host profile's CPU is not the
    host CPU of ``hw_name``'s device profile; ``None`` when they agree or either is unknown."""
    expected = device_host_cpu(hw_name) if hw_name else None
    if expected is None or not profile.host.cpu or profile.host.cpu == expected:
        return None
    text = (
        f"host profile {where} was measured on {profile.host.cpu!r}, not on {expected!r} (the host of the "
        f"{hw_name} device profile): the framework times are that CPU's"
    )
    warnings.warn(text, HostProfileWarning, stacklevel=3)
    return text
