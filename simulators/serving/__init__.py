"""Served workloads: requests arrive, a scheduler batches them, each step is priced by an op-graph
simulation of its batch shape (memoised by bucket), and latencies, throughput and KV-cache use come out.

Modules: :mod:`~simulators.serving.requests` (request model, traces, Poisson generator),
:mod:`~simulators.serving.kvcache` (KV bytes per token and capacity), :mod:`~simulators.serving.shapes`
(step shapes and buckets), :mod:`~simulators.serving.costs` (the memoised step-cost provider),
:mod:`~simulators.serving.schedulers` (static, continuous, chunked prefill),
:mod:`~simulators.serving.engine` (the request-level loop), :mod:`~simulators.serving.result` and
:mod:`~simulators.serving.report` (timeline and plot). The op graphs of steps are built on the
opgraph side (:func:`opgraph.transforms.rebatch`, :mod:`opgraph.scenario.serving`).
"""

from simulators.serving.costs import GraphStepCosts, KeyedStepCosts, StepCostModel
from simulators.serving.engine import ServingError, run_serving
from simulators.serving.kvcache import KvCacheError, KvCacheSpec
from simulators.serving.report import PLOT_FORMATS, check_plot_path, serving_timeline, write_serving_plot
from simulators.serving.requests import LengthDist, Request, WorkloadError, load_trace, poisson_workload
from simulators.serving.result import (
    DroppedRequest,
    Percentiles,
    RequestRecord,
    ServingResult,
    ServingSettings,
    ServingSummary,
    StepRecord,
    percentiles,
    summarize,
)
from simulators.serving.schedulers import (
    SCHEDULERS,
    ChunkedPrefill,
    ContinuousBatching,
    Scheduler,
    SchedulerError,
    StaticBatching,
    get_scheduler,
    register_scheduler,
)
from simulators.serving.shapes import PartKey, StepKey, StepShape, WindowKv, bucket
from simulators.serving.state import Live, Plan, ServingState

__all__ = [
    "PLOT_FORMATS",
    "SCHEDULERS",
    "ChunkedPrefill",
    "ContinuousBatching",
    "DroppedRequest",
    "GraphStepCosts",
    "KeyedStepCosts",
    "KvCacheError",
    "KvCacheSpec",
    "LengthDist",
    "Live",
    "PartKey",
    "Percentiles",
    "Plan",
    "Request",
    "RequestRecord",
    "Scheduler",
    "SchedulerError",
    "ServingError",
    "ServingResult",
    "ServingSettings",
    "ServingState",
    "ServingSummary",
    "StaticBatching",
    "StepCostModel",
    "StepKey",
    "StepRecord",
    "StepShape",
    "WindowKv",
    "WorkloadError",
    "bucket",
    "check_plot_path",
    "get_scheduler",
    "load_trace",
    "percentiles",
    "poisson_workload",
    "register_scheduler",
    "run_serving",
    "serving_timeline",
    "summarize",
    "write_serving_plot",
]
