"""Declarative scenarios: a TOML file that names a model, phases, hardware, cost model, engines and
expectations; running it captures, simulates, compares and checks, so the simulation doubles as a test.

>>> from opgraph.scenario import load_scenario, run_scenario  # doctest: +SKIP
>>> summary = run_scenario("examples/scenarios/default.scenario.toml", "out/")  # doctest: +SKIP
>>> summary.passed  # doctest: +SKIP
True

``opgraph run SCENARIO -o OUT`` is the CLI; ``pytest -p opgraph.scenario.pytest_plugin`` collects
``*.scenario.toml`` files as tests. Importing this package does not import torch.
"""

from opgraph.scenario.folder import SUMMARY_FILE
from opgraph.scenario.model import (
    SCENARIO_SUFFIX,
    Bound,
    CompareSection,
    ErrorLimits,
    Expectations,
    HardwareSection,
    Limit,
    ModelSpec,
    PhaseSpec,
    PoissonSpec,
    ReplaySection,
    Scenario,
    ScenarioError,
    ServingExpectations,
    ServingSection,
    SimulationSection,
    load_scenario,
    parse_engines,
    parse_scenario,
    scenario_name,
)
from opgraph.scenario.result import (
    ComparisonSummary,
    CoverageSummary,
    ExpectationResult,
    PhaseResult,
    ReplaySummary,
    ScenarioSummary,
    SweepRow,
)
from opgraph.scenario.runner import (
    REPORT_FILE,
    TRACE_FILE,
    Progress,
    ScenarioRun,
    failure_lines,
    planned_checks,
    run_scenario,
)
from simulators.serving.result import ServingSummary

__all__ = [
    "REPORT_FILE",
    "SCENARIO_SUFFIX",
    "SUMMARY_FILE",
    "TRACE_FILE",
    "Bound",
    "CompareSection",
    "ComparisonSummary",
    "CoverageSummary",
    "ErrorLimits",
    "ExpectationResult",
    "Expectations",
    "HardwareSection",
    "Limit",
    "ModelSpec",
    "PhaseResult",
    "PhaseSpec",
    "PoissonSpec",
    "Progress",
    "ReplaySection",
    "ReplaySummary",
    "Scenario",
    "ScenarioError",
    "ScenarioRun",
    "ScenarioSummary",
    "ServingExpectations",
    "ServingSection",
    "ServingSummary",
    "SimulationSection",
    "SweepRow",
    "failure_lines",
    "load_scenario",
    "parse_engines",
    "parse_scenario",
    "planned_checks",
    "run_scenario",
    "scenario_name",
]
