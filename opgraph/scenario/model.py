"""The scenario file: a TOML document validated by :class:`Scenario` (``opgraph schema scenario``).

A scenario declares a whole study as data: the model and the phases to capture (or saved graphs),
the hardware and cost model, the simulation (engines, policy, host, tensor parallelism), optional
replay on a device and measured timelines to compare against, and the expectations that make the
run a test. Paths inside a scenario are relative to the scenario file.

>>> s = Scenario.model_validate({"model": {"source": "llama-3.2-1b", "layers": 1},
...                              "phases": [{"phase": "prefill", "seq_len": 128}],
...                              "expect": {"makespan_us": {"max": 1e6}}})
>>> s.simulation.engine_counts
(1,)
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from opgraph.ir import OpgraphError, OpKind, check_schema_version
from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import NonNegFloat
from simulators.config import host_time_conflict

SCENARIO_SUFFIX = ".scenario.toml"
"""File names that ``opgraph run`` and the pytest plugin recognise as scenarios."""

MAX_ENGINES = 4096
"""Largest engine count of one simulation."""

MAX_SWEEP = 64
"""Most engine counts in one sweep."""


PositiveInt = Annotated[int, Field(ge=1)]
"""An integer of one or more."""

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=64)]
"""A name usable in file names: letters, digits, ``_``, ``.``, ``-``."""


class ScenarioError(OpgraphError):
    """A scenario file that cannot be read, parsed or validated, or that names something unknown."""


# ---------------------------------------------------------------- model and phases
class ModelSpec(FrozenModel):
    """The model to capture (meta device by default: no weights, no GPU)."""

    source: str
    """A preset (``llama-3.1-8b``; ``opgraph capture --list``), a ``config.json`` or model folder
    (relative to the scenario file), or a hub id in the local Hugging Face cache."""
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Weights and activations dtype."""
    layers: PositiveInt | None = None
    """Cut the model to its first N decoder layers (keeps big models fast; the head stays)."""
    attn_impl: Literal["sdpa", "eager"] = "sdpa"
    """Attention implementation the model is built with."""
    device: Literal["meta", "cpu"] = "meta"
    """Capture device: ``meta`` (no weights, any size) or ``cpu`` (random weights, small models)."""
    moe_skew: Annotated[float, Field(ge=0, le=8)] | None = None
    """Zipf exponent of MoE expert loads (unset: balanced routing)."""


class PhaseSpec(FrozenModel):
    """One captured phase (or a saved graph) that is simulated, and optionally compared and checked."""

    name: Name | None = None
    """Label of the phase in file names and reports; defaults to ``phase`` (or the graph's file stem)."""
    phase: Literal["prefill", "decode", "generate"] = "prefill"
    """``prefill`` (batch x seq_len new tokens), ``decode`` (one token over kv_len cached tokens),
    ``generate`` (a prefill then new_tokens decode steps)."""
    batch: PositiveInt = 1
    """Sequences."""
    seq_len: PositiveInt = 512
    """Prompt tokens per sequence (prefill, generate)."""
    kv_len: PositiveInt = 2048
    """Tokens already in the KV cache (decode)."""
    new_tokens: PositiveInt = 4
    """Decode steps after the prefill (generate)."""
    graph: str | None = None
    """A saved graph (``.json``/``.json.gz``) to use instead of capturing; the capture fields are then unused."""
    measured: str | None = None
    """A measured timeline of this phase (an opgraph Timeline file or a torch-profiler trace) to
    compare the simulation with."""
    expect: Expectations | None = None
    """Expectations of this phase only, added to the scenario's ``[expect]``."""

    @property
    def label(self) -> str:
        """The phase's name in files and reports."""
        if self.name:
            return self.name
        if self.graph:
            stem = Path(self.graph).name
            for suffix in (".gz", ".json", ".graph"):
                stem = stem.removesuffix(suffix)
            return re.sub(r"[^A-Za-z0-9_.\-]", "-", stem) or "graph"
        return self.phase


# ---------------------------------------------------------------- hardware and simulation
class HardwareSection(FrozenModel):
    """The device and how op times are estimated on it."""

    name: str = "h100"
    """A catalog name (``opgraph hardware list``), a hardware ``.toml``/``.json`` file, or a
    calibrated table (``opgraph calibrate``) that carries the spec it was measured on."""
    cost_model: str | None = None
    """``roofline``, ``formula``, ``table``, ``profile``, a calibrated table or profile JSON, ``module:Class``
    or ``file.py:Class``; unset: the device's measured profile when the catalog ships one, else the
    roofline (as ``opgraph simulate`` does)."""
    cost_options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Keyword arguments for the cost model's constructor."""


class SimulationSection(FrozenModel):
    """How the graph is scheduled: engines, policy, host thread, tensor parallelism."""

    engines: int | list[int] | str = 1
    """Compute engines: a count, a list of counts, or a range ``"1..8"``; several counts sweep them
    and name the smallest count within ``tolerance`` of the best makespan."""
    policy: str = "earliest"
    """Scheduling policy: ``earliest``, ``critical-path``, ``stream``, ``module:Class`` or ``file.py:Class`` (relative
    to the scenario file)."""
    host: Literal["eager", "cuda_graph", "cuda-graph", "none"] = "eager"
    """How the host issues ops: eager PyTorch, a CUDA graph replay, or no host cost."""
    host_us: NonNegFloat | None = None
    """Host time per op in microseconds (default: the hardware spec's for the host mode)."""
    tp: Annotated[int, Field(ge=1, le=1024)] = 1
    """Tensor-parallel ranks. Above 1, a graph without collectives is first sharded
    Megatron-style (``opgraph.transforms.shard_tensor_parallel``)."""
    copy_engines: Annotated[int, Field(ge=0, le=64)] = 0
    """Copy engines for MEMORY ops (0: they run on the compute engines)."""
    links: Annotated[int, Field(ge=1, le=64)] = 1
    """Communication links per communicator (collectives)."""
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.01
    """Sweep: engine counts within this fraction of the best makespan are as good as the best."""
    skip_uncosted: bool = False
    """Simulate ops the cost model cannot cost as free (they are listed) instead of failing."""
    independent_engines: bool = False
    """Every engine a whole device (a hypothetical accelerator, as in the seed's engine-count study);
    off: the ops running at once share the device's peak FLOP/s and bandwidth."""

    @field_validator("engines")
    @classmethod
    def _check_engines(cls, value: int | list[int] | str) -> int | list[int] | str:
        parse_engines(value)
        return value

    @field_validator("host_us")
    @classmethod
    def _host_to_spend_it(cls, value: float | None, info: ValidationInfo) -> float | None:
        # SimulationConfig's own rule and words (simulators.host_time_conflict), checked here so that a
        # scenario fails when it is read, naming simulation.host_us, rather than when its run builds the config.
        host = info.data.get("host")
        conflict = host_time_conflict(host.replace("-", "_"), value) if host is not None else None
        if conflict is not None:
            raise ValueError(f"{conflict} (remove host_us, or give host = 'eager' or 'cuda-graph')")
        return value

    @property
    def engine_counts(self) -> tuple[int, ...]:
        """The engine counts to simulate, ascending."""
        return parse_engines(self.engines)

    @property
    def host_mode(self) -> str:
        """The host mode in the simulator's spelling (``cuda_graph``)."""
        return self.host.replace("-", "_")


def parse_engines(value: int | list[int] | str) -> tuple[int, ...]:
    """``3`` -> (3,); ``[1, 2, 4]`` -> (1, 2, 4); ``"1..8"`` -> (1, ..., 8). Raises ``ValueError``."""
    if isinstance(value, int):
        counts = [value]
    elif isinstance(value, list):
        counts = list(value)
    else:
        m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", value)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f"empty range {value!r}: write LOW..HIGH, e.g. 1..8")
            counts = list(range(lo, hi + 1))
        else:
            try:
                counts = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                raise ValueError(f"{value!r} is not an engine count: give N, [N, M, ...] or 'LOW..HIGH'") from None
    if not counts:
        raise ValueError("no engine count given")
    bad = [c for c in counts if c < 1 or c > MAX_ENGINES]
    if bad:
        raise ValueError(f"engine count {bad[0]} is out of range 1..{MAX_ENGINES}")
    uniq = tuple(sorted(set(counts)))
    if len(uniq) > MAX_SWEEP:
        raise ValueError(f"a sweep of {len(uniq)} counts is too long (max {MAX_SWEEP})")
    return uniq


class ReplaySection(FrozenModel):
    """Replay each unique op config of the captured graphs on a real device (optional)."""

    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    max_configs: PositiveInt | None = None
    """Replay at most this many configs (the largest first, by estimated time)."""
    kinds: tuple[OpKind, ...] = ()
    """Replay only ops of these kinds (empty: every kind)."""
    check: bool = True
    """Check each op's output against a float64 reference."""
    max_samples: PositiveInt = 20
    """Most timed samples per config."""
    max_time_s: Annotated[float, Field(gt=0)] = 0.2
    """Most seconds spent sampling one config."""


class CompareSection(FrozenModel):
    """How a phase's simulation is compared with its ``measured`` timeline."""

    engines: PositiveInt | None = None
    """The simulated engine count to compare (default: the smallest simulated)."""
    join: Literal["auto", "op_id", "definition"] = "auto"
    """Join by op id (a ``capture --profile`` run of the same graph), by definition, or pick."""
    allow_different_models: bool = False
    """Compare even when the timelines name different models."""


# ---------------------------------------------------------------- expectations
class Limit(FrozenModel):
    """A closed interval ``[min, max]`` on a served-workload number; either end may be left open."""

    min: float | None = None
    """Smallest value that passes."""
    max: float | None = None
    """Largest value that passes."""

    @model_validator(mode="after")
    def _one_end(self) -> Limit:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self


class Bound(Limit):
    """A closed interval ``[min, max]``; either end may be left open."""

    engines: PositiveInt | None = None
    """The simulated engine count the bound applies to (default: the recommended count of a sweep,
    else the only count)."""


class ErrorLimits(FrozenModel):
    """Largest relative errors of the simulation against the measured timeline (fractions: 0.25 is 25%)."""

    gpu_time: NonNegFloat | None = None
    """|simulated - measured| / measured of the summed device time."""
    wall_time: NonNegFloat | None = None
    """|simulated - measured| / measured of the wall time (makespan)."""
    median_op: NonNegFloat | None = None
    """Median |relative error| over matched ops (ops of at least 5 us in the measurement)."""

    @model_validator(mode="after")
    def _some(self) -> ErrorLimits:
        if self.gpu_time is None and self.wall_time is None and self.median_op is None:
            raise ValueError("give at least one of gpu_time, wall_time, median_op")
        return self


class Expectations(FrozenModel):
    """What must hold for the scenario to pass; each one is reported, and any failure exits 1."""

    operators: str | list[str] | None = None
    """Required operators: a coverage family (``llama``; ``opgraph verify --help``), ``auto`` (the
    family that fits the graph), a family ``.toml`` file, or an explicit list of operator names."""
    makespan_us: Bound | None = None
    """Bounds on the simulated makespan in microseconds."""
    utilization: Bound | None = None
    """Bounds on the mean utilisation of the compute engines (0..1)."""
    speedup: Bound | None = None
    """Bounds on serial time over makespan."""
    recommended_engines: Bound | None = None
    """Bounds on the engine count a sweep recommends."""
    max_error: ErrorLimits | None = None
    """Largest errors against the phase's measured timeline (phases without one are not checked)."""
    replay_failures: Annotated[int, Field(ge=0)] | None = None
    """Most replayed configs that may end in ``error``, ``oom`` or ``mismatch`` (needs ``[replay]``)."""

    def merged(self, more: Expectations | None) -> Expectations:
        """These expectations with ``more``'s set fields taking precedence."""
        if more is None:
            return self
        return self.model_copy(update={k: getattr(more, k) for k in more.model_fields_set})


# ---------------------------------------------------------------- served workloads
SERVING_METRICS: tuple[str, ...] = (
    *(f"{what}_{p}_ms" for what in ("ttft", "tpot", "e2e") for p in ("p50", "p90", "p99", "mean")),
    "output_tokens_per_s",
    "total_tokens_per_s",
    "requests_per_s",
)
"""Numbers of a served workload that ``[serving.expect]`` may bound."""


if TYPE_CHECKING:
    _MetricLimits = BaseModel
else:
    # One optional limit per name of SERVING_METRICS, so the table and the model cannot drift apart.
    _MetricLimits = create_model(
        "_MetricLimits",
        __config__=ConfigDict(frozen=True, extra="forbid"),
        **{name: (Limit | None, None) for name in SERVING_METRICS},
    )


class ServingExpectations(_MetricLimits):
    """Bounds on the served workload's latency percentiles (ms) and throughput, and on its drops."""

    dropped: Annotated[int, Field(ge=0)] | None = None
    """Most requests that may be dropped (KV cache never fits, prompt above the token budget)."""


class PoissonSpec(FrozenModel):
    """A synthetic workload: Poisson arrivals and token lengths (``N``, ``LO..HI`` or ``exp:MEAN``)."""

    rate: Annotated[float, Field(gt=0)]
    """Requests per second."""
    num_requests: PositiveInt = 100
    """Requests in all."""
    prompt_len: str = "512"
    """Prompt tokens."""
    output_len: str = "128"
    """Output tokens."""
    seed: int = 0
    """Seed of arrivals and lengths."""


class ServingSection(FrozenModel):
    """A served workload of the scenario's model: requests, a batching scheduler, expectations."""

    scheduler: str = "continuous"
    """``static``, ``continuous`` or ``chunked``."""
    max_batch: PositiveInt = 64
    """Most requests running at once."""
    token_budget: PositiveInt = 8192
    """Most new tokens one step processes."""
    memory_utilisation: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Share of device memory for weights and KV cache."""
    requests: str | None = None
    """A request trace (JSONL or CSV, relative to the scenario file)."""
    poisson: PoissonSpec | None = None
    """A synthetic Poisson workload instead of a trace."""
    expect: ServingExpectations = Field(default_factory=ServingExpectations)
    """Bounds on percentiles, throughput and drops."""

    @model_validator(mode="after")
    def _one_workload(self) -> ServingSection:
        if (self.requests is None) == (self.poisson is None):
            raise ValueError("give either requests = TRACE or a [serving.poisson] section")
        return self


# ---------------------------------------------------------------- the scenario
class Scenario(FrozenModel):
    """A declarative study: capture, simulate, replay and compare, with expectations that make it a test."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version, optional in a file written by hand (read as 1); the loader refuses newer versions with a clear
    message."""
    name: Name | None = None
    """Scenario name (default: the file name without ``.scenario.toml``)."""
    description: str = ""
    """What the scenario shows, for the report."""
    model: ModelSpec | None = None
    """The model to capture; may be left out when every phase gives a ``graph``."""
    phases: Annotated[list[PhaseSpec], Field(min_length=1, max_length=32)]
    """Phases to capture and simulate, each one a graph."""
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    """Device and cost model."""
    simulation: SimulationSection = Field(default_factory=SimulationSection)
    """Engines, policy, host and tensor parallelism."""
    replay: ReplaySection | None = None
    """Replay the graphs' unique ops on a device (optional)."""
    compare: CompareSection = Field(default_factory=CompareSection)
    """How phases with a ``measured`` timeline are compared."""
    expect: Expectations = Field(default_factory=Expectations)
    """Expectations checked on every phase (a phase's own ``expect`` adds to and overrides them)."""
    serving: ServingSection | None = None
    """A served workload of the model (``opgraph serve-sim`` as data) and its expectations."""

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.serving is not None and self.model is None:
            raise ValueError("a [serving] section needs a [model] to capture")
        labels = [p.label for p in self.phases]
        dup = sorted({n for n in labels if labels.count(n) > 1})
        if dup:
            raise ValueError(f"phase names must be unique, {dup[0]!r} repeats (give each phase a name)")
        if self.model is None:
            missing = [p.label for p in self.phases if p.graph is None]
            if missing:
                raise ValueError(f"phase {missing[0]!r} has no graph and the scenario has no [model] to capture")
        counts = self.simulation.engine_counts
        for where, exp in [("expect", self.expect), *((f"phases.{p.label}.expect", p.expect) for p in self.phases)]:
            if exp is None:
                continue
            for field in ("makespan_us", "utilization", "speedup"):
                b = getattr(exp, field)
                if b is not None and b.engines is not None and b.engines not in counts:
                    raise ValueError(f"{where}.{field}.engines = {b.engines} is not a simulated count {list(counts)}")
            if exp.replay_failures is not None and self.replay is None:
                raise ValueError(f"{where}.replay_failures needs a [replay] section")
        if self.compare.engines is not None and self.compare.engines not in counts:
            raise ValueError(f"compare.engines = {self.compare.engines} is not a simulated count {list(counts)}")
        has_measured = any(p.measured for p in self.phases)
        if self.expect.max_error is not None and not has_measured:
            raise ValueError("expect.max_error needs a phase with a measured timeline")
        for p in self.phases:
            if p.expect is not None and p.expect.max_error is not None and not p.measured:
                raise ValueError(f"phases.{p.label}.expect.max_error needs phase {p.label!r} to have measured = ...")
        return self

    def expectations(self, phase: PhaseSpec) -> Expectations:
        """The expectations that apply to ``phase``."""
        return self.expect.merged(phase.expect)


PhaseSpec.model_rebuild()


# ---------------------------------------------------------------- loading
def _loc_text(loc: tuple[int | str, ...], data: Any) -> str:
    """A pydantic error location as a TOML path: ``phases[1].expect.makespan_us.max``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("int", "list[int]", "str", "constrained-int", "float", "function-after[_one_end(), Bound]"):
            continue  # union member names pydantic adds to the path
        elif "[" in part and "]" in part and "(" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    """Field names valid at the parent of ``loc`` (for a did-you-mean)."""
    cls: Any = Scenario
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(cls, "model_fields", {})
        if part not in fields:
            return []
        ann = fields[part].annotation
        cls = _model_in(ann)
        if cls is None:
            return []
    return sorted(getattr(cls, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The pydantic model class inside ``X``, ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def format_validation(exc: ValidationError, data: Any) -> tuple[str, str]:
    """The first validation error as ``(field path, message)``, with a did-you-mean for unknown fields."""
    errors = exc.errors()
    first = errors[0]
    loc = tuple(first["loc"])
    where = _loc_text(loc, data)
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
        guess = difflib.get_close_matches(str(loc[-1]), _known_fields(loc), n=1)
        if guess:
            msg += f" (did you mean {guess[0]!r}?)"
    elif first["type"] == "missing":
        msg = "missing required field"
    elif first["type"] in ("literal_error", "enum"):
        value = first.get("input")
        msg = f"{msg} (got {value!r})"
    if len(errors) > 1:
        msg += f"; and {len(errors) - 1} more"
    return where, msg


def parse_scenario(data: dict[str, Any], where: str = "scenario") -> Scenario:
    """Validate a scenario table; :class:`ScenarioError` names ``where`` and the field at fault.

    A scenario needs no ``schema_version``; one newer than this opgraph reads is a
    :class:`~opgraph.ir.SchemaVersionError` naming ``where`` (:func:`opgraph.ir.check_schema_version`).
    """
    check_schema_version(data, Scenario, where)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        field, msg = format_validation(exc, data)
        raise ScenarioError(msg, where=where if field == "(top level)" else f"{where}: {field}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (TOML). Errors are one line naming the file and field."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ScenarioError("no such scenario file", where=str(p)) from None
    except IsADirectoryError:
        raise ScenarioError("is a folder, not a scenario file", where=str(p)) from None
    except OSError as exc:
        raise ScenarioError(f"cannot read it ({exc.strerror})", where=str(p)) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScenarioError("not UTF-8 text", where=str(p), hint="a scenario is a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}", where=str(p)) from None
    return parse_scenario(data, str(p))


def scenario_name(scenario: Scenario, path: str | Path | None) -> str:
    """The scenario's name, else its file name without the ``.scenario.toml`` suffix."""
    if scenario.name:
        return scenario.name
    if path is None:
        return "scenario"
    n = Path(path).name
    for suffix in (SCENARIO_SUFFIX, ".toml"):
        if n.endswith(suffix):
            return n[: -len(suffix)] or "scenario"
    return n
