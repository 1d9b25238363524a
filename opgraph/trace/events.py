"""Compact in-memory form of one imported trace (one rank), linked, before it becomes a ``Timeline``.

Rows are slotted dataclasses rather than pydantic models so a few hundred thousand events import in
about a second; :func:`opgraph.trace.importer.to_timeline` turns them into the typed IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opgraph.ir.timeline import KernelType, SpanCategory

GPU_KINDS = (SpanCategory.KERNEL, SpanCategory.MEMCPY, SpanCategory.MEMSET)
"""Kinds of device activity."""
HOST_KINDS = (
    SpanCategory.CPU_OP,
    SpanCategory.RUNTIME,
    SpanCategory.ANNOTATION,
    SpanCategory.GPU_ANNOTATION,
    SpanCategory.PYTHON,
)
"""Kinds of host activity (``gpu_annotation`` lies on the device clock but carries no work)."""
MODULE_EVENT_PREFIX = "nn.Module:"
"""Start of the name of the ``python_function`` event of an ``nn.Module`` call (``nn.Module: Qwen3MoeExperts_0``,
with ``with_stack=True``): a module scope, kept on import while other Python events are left out."""


@dataclass(slots=True)
class GpuEvent:
    """A kernel, memcpy or memset on a device stream."""

    name: str
    kind: SpanCategory
    """One of :data:`GPU_KINDS`."""
    ts: float
    dur: float
    device: int
    stream: int
    correlation: int | None = None
    external_id: int | None = None
    grid: str | None = None
    block: str | None = None
    nbytes: int | None = None
    launch_ts: float | None = None
    """Start of the runtime call that launched it (host clock), once linked."""
    launch_name: str | None = None
    """The runtime call (``cudaLaunchKernel``, ``hipGraphLaunch``, ...)."""
    launch_op: str | None = None
    """Innermost CPU op that launched it (``aten::mm``), once linked."""
    launch_dims: Any = None
    """Input dims of that CPU op (with ``record_shapes``)."""
    launch_stack: tuple[str, ...] = ()
    """Names of the CPU ops around the launch, innermost first (``aten::mm``, ``aten::linear``, ...)."""
    launch_host: HostEvent | None = None
    """The innermost launching CPU op itself (its call order and input dims align it with graph ops)."""
    ktype: KernelType = KernelType.UNKNOWN
    """Kernel type from the classifier."""
    layer_start: bool = False
    """Matches a layer-start marker."""
    vote: str | None = None
    """Stage vote from its name: ``prefill`` or ``decode``."""
    ours: dict[str, Any] | None = None
    """Op attribution written by opgraph's own exporter (op_id, definition, layer, stage, step, bound)."""

    @property
    def launched_by_matmul(self) -> bool:
        """A matmul CPU op launched it (``aten::mm``, ``aten::bmm``, ``aten::_grouped_mm``... in its launch
        stack): what it computes is a GEMM, whatever its name says."""
        return any(op.endswith("mm") for op in self.launch_stack)


@dataclass(slots=True)
class HostEvent:
    """A CPU op, runtime call, user annotation or Python function on a host thread."""

    name: str
    kind: SpanCategory
    """One of :data:`HOST_KINDS`."""
    ts: float
    dur: float
    pid: int | str
    tid: int | str
    external_id: int | None = None
    correlation: int | None = None
    input_dims: Any = None
    parent: HostEvent | None = None
    """The CPU op that encloses this one on its thread (CPU ops only, once linked)."""


@dataclass
class TraceData:
    """One rank of a trace, linked: device and host events, metadata, and what the file lacked."""

    file: str
    rank: int | None = None
    world_size: int | None = None
    device_name: str = ""
    device_props: list[dict[str, Any]] = field(default_factory=list)
    runtime: str = ""
    """``cuda`` or ``hip`` (from the runtime calls seen)."""
    gpu: list[GpuEvent] = field(default_factory=list)
    host: list[HostEvent] = field(default_factory=list)
    origin_us: float = 0.0
    """Raw timestamp that became 0 (the earliest event)."""
    base_time_ns: int | None = None
    notes: list[str] = field(default_factory=list)
    """What the file lacked or what was assumed."""
    incomplete: list[str] = field(default_factory=list)
    """Reasons the data is partial (events skipped); empty when complete."""
    events_total: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    """Scalar top-level metadata kept for the timeline's source config."""

    @property
    def complete(self) -> bool:
        """No event was skipped."""
        return not self.incomplete
