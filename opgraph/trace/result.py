"""Typed results of the kernel analyzer (saved with ``opgraph analyze --json``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import KernelType

StageLabel = Literal["prefill", "decode", "mixed", "idle", "unknown"]
"""Stage of a pass or layer; ``mixed`` is a step that batches prefill and decode requests."""
StageSource = Literal["annotation", "vote", "shape", "propagated", "timing", "none"]
"""Where a stage came from: a step annotation, kernel-name votes, attention input shapes (query length),
the neighbouring layers, or the timing fallback (a long first pass before similar short ones)."""
LayerKind = Literal["MHA_FC", "MHA_MOE", "MLA_FC", "MLA_MOE", "ATTN", "MOE", "FC", "UNKNOWN"]
"""Layer type from its kernels: attention variant and feed-forward kind; halves are ``ATTN``/``MOE``/``FC``."""


class Bucket(FrozenModel):
    """Count and time of the kernels in one group (a type, a stage)."""

    name: str
    """Group name."""
    count: int
    """Kernels."""
    time_us: float
    """Summed kernel time."""
    pct: float
    """Share of all kernel time, in percent."""


class StageTypeRow(FrozenModel):
    """Kernels of one type within one stage."""

    stage: StageLabel
    type: KernelType
    count: int
    time_us: float


class UniqueKernel(FrozenModel):
    """One distinct kernel name with its statistics (as ``extract_unique_kernels``)."""

    name: str
    """Full kernel name."""
    short_name: str
    """Display name."""
    type: KernelType
    """Kernel type."""
    count: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    pct: float
    """Share of all kernel time, in percent."""
    stages: tuple[StageLabel, ...] = ()
    """Stages it ran in."""
    launch_ops: tuple[str, ...] = ()
    """CPU ops that launched it (up to three)."""
    grids: tuple[str, ...] = ()
    """Distinct grid sizes seen (up to three)."""


class LayerInfo(FrozenModel):
    """One detected transformer layer (or half-layer with ``--split-half-layers``)."""

    index: int
    """Global index over the trace."""
    pass_index: int
    """Forward pass it belongs to."""
    layer: int
    """Index within its pass."""
    kind: LayerKind
    stage: StageLabel
    stage_source: StageSource
    start_us: float
    end_us: float
    kernels: int
    time_us: float
    """Summed kernel time."""
    attention_us: float
    gemm_us: float
    moe_us: float
    communication_us: float
    norms: int
    """Layer-start norm markers inside it (2 for a standard pre-norm block)."""
    half_layers: int = 1
    """Half-layers merged into it (2 when the norm fires twice per block and halves were merged)."""


class PassInfo(FrozenModel):
    """One forward pass (an engine step or a ``generate`` iteration)."""

    index: int
    stage: StageLabel
    stage_source: StageSource
    layers: int
    """Layers detected."""
    kernels: int
    time_us: float
    """Summed kernel time, in and outside layers."""
    start_us: float
    end_us: float
    annotation: str = ""
    """The step annotation that delimits it, when there is one."""
    tokens: int | None = None
    """Tokens in the step, when the annotation says."""


class CollectiveInfo(FrozenModel):
    """Communication kernels of one name."""

    name: str
    count: int
    time_us: float


class RankSummary(FrozenModel):
    """One rank of a multi-rank trace."""

    rank: int
    file: str
    kernels: int
    time_us: float
    offset_us: float
    """Shift applied to align this rank's clock with rank 0 (from matching collectives)."""
    residual_us: float
    """Median misalignment of matched collective ends after the shift."""
    collectives: tuple[CollectiveInfo, ...]
    layers: int
    passes: int


class AnalysisResult(FrozenModel):
    """What the analyzer found in a measured trace: kernels by type, stage and layer, passes, unknowns."""

    schema_version: Literal[1] = 1
    source: str
    """Trace file (or timeline name) analysed."""
    device: str
    rank: int | None = None
    """Rank described by the top-level fields, for multi-rank traces."""
    complete: bool
    """False when events were skipped (see ``notes``): the numbers then cover part of the trace."""
    notes: tuple[str, ...] = ()
    kernels: int
    """Kernel count (memcpy and memset excluded). This and every total and table below count the trace's own
    device work: the events set apart at the window's start (``window_events``) are left out."""
    kernel_time_us: float
    """Summed kernel time."""
    memcpy: int
    """Memcpy and memset events."""
    memcpy_time_us: float
    gpu_busy_us: float
    """Union of device activity intervals."""
    makespan_us: float
    """First device start to last device end."""
    unknown_pct: float
    """Share of kernel time with no matching pattern, in percent."""
    unknown_count_pct: float
    """Share of kernels with no matching pattern, in percent."""
    attention: Literal["mha", "mla", "none"]
    """Attention variant detected (MLA from MLA-specific kernels)."""
    half_layers_merged: bool
    """Layers were assembled from half-layers (the norm fires twice per block)."""
    split_half_layers: bool = False
    """Layers are reported as halves (``--split-half-layers``)."""
    by_type: tuple[Bucket, ...]
    by_stage: tuple[Bucket, ...]
    by_stage_type: tuple[StageTypeRow, ...]
    passes: tuple[PassInfo, ...]
    layers_per_pass: tuple[int, ...]
    stage_passes: dict[str, int] = Field(default_factory=dict)
    """Passes per stage."""
    layers: tuple[LayerInfo, ...]
    orphan_kernels: int
    """Kernels outside every layer (embedding, LM head, sampling, bookkeeping)."""
    orphan_time_us: float
    window_events: int = 0
    """Device events at the start that ran work launched before the profiler window opened (no launch in
    the trace: an earlier step's tail): set apart, in no pass or layer, not orphans, and left out of every
    total and table (kernels, times, busy, span, by type and stage, unique kernels), as ``opgraph compare``
    and :func:`~opgraph.trace.attribute_kernels` leave them out."""
    window_time_us: float = 0.0
    """Summed duration of those events."""
    unique_kernels: tuple[UniqueKernel, ...]
    unknown_kernels: tuple[UniqueKernel, ...]
    collectives: tuple[CollectiveInfo, ...]
    patterns: tuple[str, ...] = ()
    """Pattern families consulted, in order."""
    ranks: tuple[RankSummary, ...] = ()
    """Per-rank summary of multi-rank traces (the top-level fields describe ``rank``)."""
