"""Measured timelines from torch-profiler (Kineto) traces, and the kernel analyzer.

``load_trace(path)`` imports a ``.json``/``.json.gz`` trace, a folder of per-rank traces or a
``.tar.gz`` into a measured :class:`~opgraph.ir.Timeline`; ``analyze(timeline_or_path)`` classifies
every kernel by type, stage (prefill/decode) and transformer layer and returns an
:class:`AnalysisResult`. Kernel patterns are TOML data files (``opgraph/trace/patterns/``) that users
extend with ``load_patterns([file])`` or ``$OPGRAPH_PATTERNS_DIR``.
"""

from opgraph.trace.analysis import Analyzer
from opgraph.trace.api import (
    RankAlignment,
    align_ranks,
    analyze,
    analyze_full,
    load_trace,
    load_trace_data,
    load_traces,
)
from opgraph.trace.attribution import KernelAttribution, OpKernelTime, attribute_kernels
from opgraph.trace.classify import KernelClassifier
from opgraph.trace.events import GpuEvent, HostEvent, TraceData
from opgraph.trace.importer import from_timeline, to_timeline
from opgraph.trace.patterns import KernelType, PatternError, PatternSet, default_patterns, load_patterns
from opgraph.trace.reader import NoTraceEventsError, TraceFormatError, discover, read_trace
from opgraph.trace.result import (
    AnalysisResult,
    Bucket,
    CollectiveInfo,
    LayerInfo,
    PassInfo,
    RankSummary,
    StageTypeRow,
    UniqueKernel,
)

__all__ = [
    "AnalysisResult",
    "Analyzer",
    "Bucket",
    "CollectiveInfo",
    "GpuEvent",
    "HostEvent",
    "KernelAttribution",
    "KernelClassifier",
    "KernelType",
    "LayerInfo",
    "NoTraceEventsError",
    "OpKernelTime",
    "PassInfo",
    "PatternError",
    "PatternSet",
    "RankAlignment",
    "RankSummary",
    "StageTypeRow",
    "TraceData",
    "TraceFormatError",
    "UniqueKernel",
    "align_ranks",
    "analyze",
    "analyze_full",
    "attribute_kernels",
    "default_patterns",
    "discover",
    "from_timeline",
    "load_patterns",
    "load_trace",
    "load_trace_data",
    "load_traces",
    "read_trace",
    "to_timeline",
]
