"""Replay of ops on a device, numeric checks, coverage and sweeps.

Replay takes the unique op configs of one or many graphs, runs each on a device with synthetic
inputs the way PyTorch runs it in the model, checks it against a float64 reference, times it with
device events and (with NVML) measures its energy; results stream to JSONL. Importing this package
does not import torch.

>>> from validators import unique_configs, replay_graph  # doctest: +SKIP
>>> for result in replay_graph(graph, device="cuda"):  # doctest: +SKIP
...     print(result.definition, result.status.value, result.median_us)
"""

from validators.collectives import (
    CollectiveBenchError,
    CollectiveBenchmark,
    CollectiveCase,
    CollectiveJob,
    CollectiveMeasurement,
    TransferSplit,
    collective_cases,
    format_measurement,
    load_measurements,
    run_collective_job,
    split_wait,
    transfer_split,
)
from validators.configs import OpConfig, config_key, cost_estimator, roofline_estimator, unique_configs
from validators.coverage import CoverageReport, auto_expectation, format_report, load_expectation, verify_graph
from validators.energy import ClockSampler
from validators.inputs import DeviceError, match_inputs, resolve_device, routing_counts
from validators.numerics import TOLERANCES, Tolerance
from validators.recipes import RECIPES, BuildContext, Case, Recipe, RecipeSelector, register_recipe
from validators.replay import DeviceLostError, Replayer, ReplayOptions, replay_configs, replay_graph, replay_op
from validators.results import (
    Coverage,
    EnergyStats,
    NumericCheck,
    ReplayResult,
    ReplayStatus,
    ResultWriter,
    RunToRun,
    TimingStats,
    coverage,
    iter_results,
    load_results,
    run_to_run,
)
from validators.runner import ReplayRun, run_replay, time_issue
from validators.sequence import IssueSequence, SequenceIssue, issue_in_sequence, load_issue
from validators.sweep import SweepLoader, check_replay, sweep_params, write_sweep_module
from validators.timing import CudaTimerKind, TimingConfig, ci_rel, stop_sampling

__all__ = [
    "RECIPES",
    "TOLERANCES",
    "BuildContext",
    "Case",
    "ClockSampler",
    "CollectiveBenchError",
    "CollectiveBenchmark",
    "CollectiveCase",
    "CollectiveJob",
    "CollectiveMeasurement",
    "Coverage",
    "CoverageReport",
    "CudaTimerKind",
    "DeviceError",
    "DeviceLostError",
    "EnergyStats",
    "IssueSequence",
    "NumericCheck",
    "OpConfig",
    "Recipe",
    "RecipeSelector",
    "ReplayOptions",
    "ReplayResult",
    "ReplayRun",
    "ReplayStatus",
    "Replayer",
    "ResultWriter",
    "RunToRun",
    "SequenceIssue",
    "SweepLoader",
    "TimingConfig",
    "TimingStats",
    "Tolerance",
    "TransferSplit",
    "auto_expectation",
    "check_replay",
    "ci_rel",
    "collective_cases",
    "config_key",
    "cost_estimator",
    "coverage",
    "format_measurement",
    "format_report",
    "issue_in_sequence",
    "iter_results",
    "load_expectation",
    "load_issue",
    "load_measurements",
    "load_results",
    "match_inputs",
    "register_recipe",
    "replay_configs",
    "replay_graph",
    "replay_op",
    "resolve_device",
    "roofline_estimator",
    "routing_counts",
    "run_collective_job",
    "run_replay",
    "run_to_run",
    "split_wait",
    "stop_sampling",
    "sweep_params",
    "time_issue",
    "transfer_split",
    "unique_configs",
    "verify_graph",
    "write_sweep_module",
]
