"""SimPy schedulers that run an op graph on engines and return a Timeline.

>>> from opgraph.ir import OpGraph, Edge, Elementwise
>>> from simulators import SchedulingProblem, SimulationConfig, run_problem
>>> ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(3))
>>> graph = OpGraph(ops=ops, edges=(Edge(src=0, dst=2), Edge(src=1, dst=2)))
>>> problem = SchedulingProblem.from_durations(graph, {0: 4.0, 1: 4.0, 2: 1.0})
>>> run_problem(problem, SimulationConfig.standard(engines=2)).makespan_us
5.0
"""

from simulators.api import cost_problem, default_host_us, run_problem, simulate, sweep_engines, uncosted_error
from simulators.config import EngineGroup, EngineRole, HostConfig, HostMode, SimulationConfig, host_time_conflict
from simulators.costing import FixedCostModel
from simulators.errors import SimulationConfigError, SimulationError, UncostedOpsError
from simulators.generation import GenerationSimulation, StepWindow, simulate_generation
from simulators.kernel import KernelResult, RankRecord, Simulator
from simulators.policies import POLICIES, SchedulingPolicy, get_policy
from simulators.problem import SchedulingProblem, UncostedOp
from simulators.result import SimulationResult
from simulators.stats import (
    Breakdown,
    CriticalPathStats,
    EngineStats,
    EngineSweep,
    HostStats,
    SimulationStats,
    SweepPoint,
    UncostedOpStats,
)

__all__ = [
    "POLICIES",
    "Breakdown",
    "CriticalPathStats",
    "EngineGroup",
    "EngineRole",
    "EngineStats",
    "EngineSweep",
    "FixedCostModel",
    "GenerationSimulation",
    "HostConfig",
    "HostMode",
    "HostStats",
    "KernelResult",
    "RankRecord",
    "SchedulingPolicy",
    "SchedulingProblem",
    "SimulationConfig",
    "SimulationConfigError",
    "SimulationError",
    "SimulationResult",
    "SimulationStats",
    "Simulator",
    "StepWindow",
    "SweepPoint",
    "UncostedOp",
    "UncostedOpStats",
    "UncostedOpsError",
    "cost_problem",
    "default_host_us",
    "get_policy",
    "host_time_conflict",
    "run_problem",
    "simulate",
    "simulate_generation",
    "sweep_engines",
    "uncosted_error",
]
