"""What a scenario run produced: per-phase results, every expectation's outcome, the artefacts.

:class:`ScenarioSummary` is written to ``summary.json`` in the output folder (``opgraph schema
scenario_summary`` gives its JSON schema).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import NonNegFloat
from simulators.serving.result import ServingSummary


class ExpectationResult(FrozenModel):
    """The outcome of one expectation on one phase (or of the whole run)."""

    id: str
    """Stable id: ``<phase>/<check>`` (``prefill/makespan_us``) or ``replay/replay_failures``."""
    phase: str
    """The phase checked (``replay`` for replay checks)."""
    check: str
    """The expectation (``operators``, ``makespan_us``, ``max_error.gpu_time``, ...)."""
    passed: bool
    """True when it holds."""
    value: float | str | None = None
    """What was observed (a number, or a short text such as the missing operators)."""
    limit: str = ""
    """The bound it was checked against, as text (``<= 5 ms``, ``family llama``)."""
    message: str
    """One line saying what was checked and what was found."""


class SweepRow(FrozenModel):
    """One simulated engine count of a phase."""

    engines: int
    """Compute engines."""
    makespan_us: NonNegFloat
    """Simulated makespan."""
    speedup: NonNegFloat
    """Serial time over makespan."""
    utilization: NonNegFloat
    """Mean utilisation of the compute engines (rank 0)."""
    timeline: str
    """Timeline file in the output folder."""


class CoverageSummary(FrozenModel):
    """Operator coverage of a phase's graph."""

    family: str
    """Expectation family (or ``scenario`` for an explicit list)."""
    required: int
    """Required operators."""
    missing: tuple[str, ...]
    """Required operators the graph lacks."""
    report: str
    """Text report file in the output folder."""


class ComparisonSummary(FrozenModel):
    """A phase's simulation against its measured timeline."""

    measured: str
    """The measured timeline or trace (as given, resolved)."""
    engines: int
    """Simulated engine count compared."""
    join: str
    """How spans were matched (``op_id`` or ``definition``)."""
    matched: int
    """Ops matched."""
    gpu_time_error: float
    """(simulated - measured) / measured device time."""
    wall_time_error: float
    """(simulated - measured) / measured wall time."""
    median_op_error: float | None
    """Median |relative error| over matched ops of at least 5 us."""
    by_kind: dict[str, float] = Field(default_factory=dict)
    """Relative error of the summed device time of each op kind."""


class PhaseResult(FrozenModel):
    """What one phase produced."""

    name: str
    """Phase label."""
    phase: str
    """Graph phase (``prefill``, ``decode``, ``generate``, or the saved graph's)."""
    model: str
    """Model name from the graph."""
    graph: str
    """Graph file in the output folder."""
    ops: int
    """Ops in the simulated graph (after sharding when ``tp > 1``)."""
    kernel_ops: int
    """Ops that launch a kernel (views excluded)."""
    flops: NonNegFloat
    """Total FLOPs (one rank)."""
    bytes: NonNegFloat
    """Total bytes read and written (one rank)."""
    sweep: tuple[SweepRow, ...]
    """Each simulated engine count."""
    recommended_engines: int
    """Smallest count within the tolerance of the best makespan (the only count without a sweep)."""
    critical_path_us: NonNegFloat
    """Longest dependent chain of device time: no engine count beats it."""
    collective_us: NonNegFloat = 0.0
    """Device time of collectives at the recommended count (rank 0)."""
    by_kind_us: dict[str, float] = Field(default_factory=dict)
    """Device time by op kind at the recommended count (rank 0)."""
    coverage: CoverageSummary | None = None
    """Operator coverage, when expected operators were given."""
    comparison: ComparisonSummary | None = None
    """Comparison with the measured timeline, when the phase has one."""
    assumptions: tuple[str, ...] = ()
    """Assumptions the capture made (MoE routing, attention fallback)."""


class ReplaySummary(FrozenModel):
    """The replay of the graphs' unique op configs."""

    device: str
    """Torch device replayed on."""
    device_name: str
    """Its model name."""
    configs: int
    """Configs replayed (after ``kinds`` and ``max_configs``)."""
    total_configs: int
    """Unique configs in the graphs."""
    statuses: dict[str, int]
    """Configs per status (``ok``, ``mismatch``, ``unsupported``, ...)."""
    results: str
    """JSONL results file in the output folder."""


class ScenarioSummary(FrozenModel):
    """Everything a scenario run decided: written to ``summary.json``."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version; the loader refuses newer versions with a clear message and reads a file without one (written
    before it was kept) as version 1."""
    name: str
    """Scenario name."""
    file: str
    """The scenario file."""
    description: str = ""
    """What it shows."""
    hardware: str
    """Hardware name."""
    cost_model: str
    """Cost model name."""
    policy: str
    """Scheduling policy."""
    host: str
    """Host mode."""
    tp: int
    """Tensor-parallel ranks."""
    phases: tuple[PhaseResult, ...]
    """Each phase, in scenario order."""
    replay: ReplaySummary | None = None
    """The replay, when the scenario asks for one."""
    serving: ServingSummary | None = None
    """The served workload's headline numbers, when the scenario has a ``[serving]`` section
    (the whole result is in ``serving.result.json``)."""
    expectations: tuple[ExpectationResult, ...]
    """Every expectation's outcome."""
    passed: bool
    """True when every expectation holds."""
    artefacts: tuple[str, ...]
    """Files written to the output folder (names relative to it)."""
    elapsed_s: NonNegFloat = 0.0
    """Wall time of the run."""

    @property
    def failures(self) -> list[ExpectationResult]:
        """The expectations that do not hold."""
        return [e for e in self.expectations if not e.passed]
