"""``Timeline``: spans on tracks, shared by simulated, measured and replayed runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_serializer, field_validator, model_validator

from opgraph.ir.graph import Scalar
from opgraph.ir.ops import OpKind, Stage
from opgraph.ir.tensor import FrozenModel

NonNegFloat = Annotated[float, Field(ge=0)]
"""A float that is zero or more (durations)."""


class TimelineKind(str, Enum):
    """Where a timeline's spans came from."""

    SIMULATED = "simulated"
    MEASURED = "measured"
    REPLAY = "replay"


class KernelType(str, Enum):
    """What a GPU kernel does, at the granularity of a performance breakdown."""

    ATTENTION = "attention"
    GEMM = "gemm"
    MOE = "moe"
    NORM = "norm"
    ACTIVATION = "activation"
    ROPE = "rope"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MEMORY = "memory"
    COMMUNICATION = "communication"
    QUANTIZATION = "quantization"
    SAMPLING = "sampling"
    EMBEDDING = "embedding"
    OTHER = "other"
    UNKNOWN = "unknown"


class SpanCategory(str, Enum):
    """What a span is: device work (a kernel of some type, a copy, a simulated op) or host activity.

    Values are the strings saved in timeline files. Measured kernels carry their kernel type (``gemm``,
    ``attention``, ... as :class:`opgraph.trace.KernelType`), simulated timelines may carry the op kind;
    :attr:`is_device` is the one rule for what counts as device time, used by every report.
    """

    # Device work: generic kinds of device activity.
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    # Device work: every kernel type of measured kernels, under its own name and value (an enum cannot
    # extend another, so the names stand here again; the values are KernelType's).
    ATTENTION = KernelType.ATTENTION.value
    GEMM = KernelType.GEMM.value
    MOE = KernelType.MOE.value
    NORM = KernelType.NORM.value
    ACTIVATION = KernelType.ACTIVATION.value
    ROPE = KernelType.ROPE.value
    ELEMENTWISE = KernelType.ELEMENTWISE.value
    REDUCTION = KernelType.REDUCTION.value
    MEMORY = KernelType.MEMORY.value
    COMMUNICATION = KernelType.COMMUNICATION.value
    QUANTIZATION = KernelType.QUANTIZATION.value
    SAMPLING = KernelType.SAMPLING.value
    EMBEDDING = KernelType.EMBEDDING.value
    OTHER = KernelType.OTHER.value
    UNKNOWN = KernelType.UNKNOWN.value
    # Device work: op kinds of simulated ops that are no kernel type (the other op kinds are above).
    SOFTMAX = "softmax"
    TOPK = "topk"
    MOE_ROUTING = "moe_routing"
    COLLECTIVE = "collective"
    VIEW = "view"
    # Host activity (and GPU-side annotations, which mark time but do no work).
    HOST = "host"
    """The host issuing a simulated op."""
    CPU_OP = "cpu_op"
    """A framework operator on a CPU thread (``aten::mm``)."""
    RUNTIME = "runtime"
    """A CUDA/HIP runtime or driver call (``cudaLaunchKernel``)."""
    ANNOTATION = "annotation"
    """A user annotation on a CPU thread (``record_function``, an engine step)."""
    GPU_ANNOTATION = "gpu_annotation"
    """A user annotation drawn on the device clock; it spans kernels but is no work of its own."""
    PYTHON = "python"
    """A Python function call."""

    @property
    def is_device(self) -> bool:
        """True for device work (kernels, copies, simulated ops): the spans that make up device time."""
        return self not in _NOT_DEVICE

    @classmethod
    def parse(cls, value: str) -> SpanCategory:
        """The category of ``value``: a value, or a Kineto ``cat`` alias (``cuda_runtime``, ``gpu_memcpy``)."""
        key = value.lower()
        return cls(CATEGORY_ALIASES.get(key, key))


_NOT_DEVICE = frozenset(
    {
        SpanCategory.HOST,
        SpanCategory.CPU_OP,
        SpanCategory.RUNTIME,
        SpanCategory.ANNOTATION,
        SpanCategory.GPU_ANNOTATION,
        SpanCategory.PYTHON,
    }
)

CATEGORY_ALIASES: dict[str, str] = {
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "operator": "cpu_op",
    "cpu": "cpu_op",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "hip_runtime": "runtime",
    "launch": "runtime",
    "user_annotation": "annotation",
    "trace": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "overhead": "host",
}
"""Other spellings of categories (Kineto's ``cat`` names, older files) and the value each stands for."""


class Bound(str, Enum):
    """What limits an op's time (the cost model's verdict, saved on simulated spans)."""

    COMPUTE = "compute"
    MEMORY = "memory"
    LAUNCH = "launch"
    HOST = "host"
    LINK = "link"
    FREE = "free"
    """No kernel: views and other metadata ops."""


class TimelineSource(FrozenModel):
    """Provenance of a timeline."""

    kind: TimelineKind
    """Simulated, measured or replayed."""
    name: str = ""
    """Short label shown in reports and as the Perfetto process name."""
    device: str = ""
    """Hardware it ran on (measured) or was simulated for."""
    trace_file: str = ""
    """The profiler trace it was imported from (measured)."""
    graph_model: str = ""
    """Model of the graph the spans refer to, when they carry op ids."""
    config: dict[str, Scalar] = Field(default_factory=dict)
    """Settings that produced it (engines, policy, cost model, versions)."""


class Span(FrozenModel):
    """One interval of work on one track (an engine, a stream, a thread)."""

    name: str
    """Kernel or op name shown in traces."""
    track: str
    """Engine, stream or thread it ran on."""
    start_us: float
    """Start, microseconds from the timeline's origin."""
    dur_us: NonNegFloat
    """Duration in microseconds."""
    op_id: int | None = None
    """Id of the graph op this span runs, when known."""
    kind: OpKind | None = None
    """Op kind, when known."""
    category: SpanCategory | None = None
    """Kernel type of a measured kernel (gemm, ...), memcpy/memset, or host activity (cpu_op, runtime, ...)."""
    layer: int | None = None
    """Transformer layer."""
    stage: Stage | None = None
    """Prefill or decode."""
    step: int | None = None
    """Forward-pass index."""
    definition: str | None = None
    """Op definition name, for joins by definition."""
    bound: Bound | None = None
    """What bounds a simulated span: compute, memory, launch, host, link."""
    args: dict[str, Scalar] = Field(default_factory=dict)
    """Other attributes (grid, correlation id, FLOPs, bytes)."""

    @field_validator("category", mode="before")
    @classmethod
    def _category_alias(cls, value: Any) -> Any:
        return SpanCategory.parse(value) if isinstance(value, str) else value

    @field_serializer("category", "bound")
    def _saved_string(self, value: Enum | str | None) -> str | None:
        # Saved as the plain value; spans built without validation (the simulator's fast path) may
        # hold the value itself rather than the member, which is the same string.
        return value.value if isinstance(value, Enum) else value

    @property
    def on_device(self) -> bool:
        """Whether the span is device work (see :attr:`SpanCategory.is_device`; no category: a simulated op)."""
        cat = self.category
        # SpanCategory(...) also accepts the plain value of spans built without validation.
        return cat is None or SpanCategory(cat).is_device

    @property
    def end_us(self) -> float:
        """End time."""
        return self.start_us + self.dur_us


class Timeline(FrozenModel):
    """Spans with a source. Spans are kept sorted by start time."""

    schema_version: Literal[1] = 1
    """Format version."""
    source: TimelineSource
    """Where the spans came from."""
    spans: tuple[Span, ...] = ()
    """The spans."""
    wall_us: float | None = None
    """Measured or simulated end-to-end wall time, when it differs from the span extent."""
    notes: tuple[str, ...] = ()
    """What the source lacked or what was assumed (missing fields, truncated trace)."""

    _tracks: list[str] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _sorted(self) -> Timeline:
        spans = self.spans
        if any(spans[i].start_us > spans[i + 1].start_us for i in range(len(spans) - 1)):
            object.__setattr__(self, "spans", tuple(sorted(spans, key=lambda s: (s.start_us, s.track))))
        return self

    def __eq__(self, other: object) -> bool:
        # Compare the saved fields only, not the private track cache.
        if not isinstance(other, Timeline):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((self.source.kind, self.source.name, len(self.spans)))

    def __iter__(self) -> Iterator[Span]:  # type: ignore[override]
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def start_us(self) -> float:
        """Earliest span start (0 when empty)."""
        return min((s.start_us for s in self.spans), default=0.0)

    @property
    def end_us(self) -> float:
        """Latest span end (0 when empty)."""
        return max((s.end_us for s in self.spans), default=0.0)

    @property
    def makespan_us(self) -> float:
        """Extent from first start to last end."""
        return self.end_us - self.start_us if self.spans else 0.0

    def tracks(self) -> list[str]:
        """Track names in first-use order."""
        if self._tracks is None:
            self._tracks = list(dict.fromkeys(s.track for s in self.spans))
        return self._tracks

    def device_spans(self) -> list[Span]:
        """The spans that are device work (:attr:`Span.on_device`): device time is the sum of their durations."""
        return [s for s in self.spans if s.on_device]

    def busy_us(self, track: str | None = None) -> float:
        """Union of span intervals (on one track, or on all), so overlapping spans count once."""
        return union_length((s.start_us, s.end_us) for s in self.spans if track is None or s.track == track)


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals, overlaps counted once."""
    total, cur_s, cur_e = 0.0, None, 0.0
    for s, e in sorted(intervals):
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_s is not None:
        total += cur_e - cur_s
    return total


def span_factory() -> Callable[[dict[str, Any]], Span]:
    """A builder of :class:`Span` objects from complete field dicts that are valid by construction.

    The simulator and the trace importer build hundreds of thousands of spans from data they have
    already checked; validating each span again costs more than the rest of their work. The builder
    sets pydantic's documented instance attributes directly; it is returned only when it gives exactly
    what validation gives on this pydantic (checked here, once), else validation is returned. Each dict
    must hold every field of :class:`Span`, in declaration order.

    >>> make = span_factory()
    >>> make({**{k: None for k in Span.model_fields}, "name": "k", "track": "t", "start_us": 0.0,
    ...       "dur_us": 1.0, "args": {}}).end_us
    1.0
    """
    all_fields = set(Span.model_fields)

    def unchecked(fields: dict[str, Any]) -> Span:
        span = object.__new__(Span)
        object.__setattr__(span, "__dict__", fields)
        # one set shared by all: a frozen span never adds to it, and model_copy copies it first
        object.__setattr__(span, "__pydantic_fields_set__", all_fields)
        object.__setattr__(span, "__pydantic_extra__", None)
        object.__setattr__(span, "__pydantic_private__", None)
        return span

    probe: dict[str, Any] = {
        **{k: f.get_default(call_default_factory=True) for k, f in Span.model_fields.items()},
        "name": "gemm_n8_k8",
        "track": "compute0",
        "start_us": 1.5,
        "dur_us": 2.0,
        "op_id": 3,
        "kind": OpKind.GEMM,
        "category": SpanCategory.KERNEL,
        "layer": 0,
        "stage": Stage.DECODE,
        "bound": Bound.COMPUTE,
        "args": {"type": "kernel", "device": 0},
    }
    try:
        fast, ref = unchecked(dict(probe)), Span.model_validate(probe)
        if fast == ref and fast.model_dump_json() == ref.model_dump_json():
            return unchecked
    except Exception:  # a pydantic without these attributes: validate instead
        pass
    return Span.model_validate
