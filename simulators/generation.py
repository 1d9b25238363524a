"""Simulating long generations without simulating every step: the prefix, then a few windows.

A planned generate graph (:class:`~opgraph.ir.generation.GenerationPlan`) repeats one decode step
whose costs drift slowly with the KV length. :func:`simulate_generation` simulates

* the recorded part of the graph (the prefill and decode steps 1..``base_step``) as any graph;
* at a few representative steps ``k`` (every planned step for short generations, else up to
  ``max_windows`` spread evenly, always the first and the last), the two-step window ``k-1, k``
  built from the plan: its makespan less the end of step ``k-1`` in it is what step ``k`` adds to
  the generation once the step before it has run (its *increment*);

and adds up the increments, interpolating linearly between representative steps (a step's costs are
affine in its KV length, so its increment is too, up to the cost model's kinks). The last step,
which has no sampler, is always simulated. Simulated work is then a few steps however long the
generation; each window is costed and scheduled by the ordinary simulator (:func:`simulate`), so
host issue, engines and policies behave as they do for any graph.

:meth:`GenerationSimulation.timeline` expands the timeline lazily: the recorded part's spans, then
each planned step's spans taken from its nearest representative window, shifted to the step's start
and renumbered to the step's op ids (their durations are the representative step's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opgraph.ir import OpBase, OpGraph
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.graph import Edge, EdgeKind
from opgraph.ir.timeline import Span, Timeline
from simulators.errors import SimulationError

if TYPE_CHECKING:
    from hardware.base import CostModel
    from hardware.spec import HardwareSpec
    from simulators.config import SimulationConfig
    from simulators.result import SimulationResult

MAX_WINDOWS = 4
"""Representative steps simulated at most (besides the first and the last planned step)."""


@dataclass
class StepWindow:
    """A representative step's windows and the increment they give."""

    step: int
    """The step whose increment the windows measure."""
    increment_us: float
    """Makespan of steps ``step-1, step`` less the end of step ``step-1`` in it."""
    result: SimulationResult
    """The two-step window's simulation (its second step's spans stand for nearby steps)."""


@dataclass
class GenerationSimulation:
    """A planned generation simulated from its recorded part and a few windows."""

    graph: OpGraph
    """The planned graph simulated."""
    prefix: SimulationResult
    """The recorded part's simulation (prefill and decode steps 1..``base_step``)."""
    windows: dict[int, StepWindow]
    """The representative steps' windows, by step."""
    increments_us: dict[int, float]
    """What each planned step adds to the makespan (simulated at representative steps, else interpolated)."""
    notes: list[str] = field(default_factory=list)
    """How the generation was simulated (windows, interpolation), for reports."""

    @property
    def makespan_us(self) -> float:
        """The generation's simulated makespan."""
        return self.prefix.makespan_us + sum(self.increments_us.values())

    def step_start_us(self, step: int) -> float:
        """When the planned ``step`` starts adding to the makespan (the end of the step before)."""
        return self.prefix.makespan_us + sum(v for k, v in self.increments_us.items() if k < step)

    def _representative(self, step: int) -> int:
        """The simulated step whose spans stand for ``step``: itself, the last step for the last, else the nearest."""
        plan = self.graph.generation
        assert plan is not None
        if step in self.windows:
            return step
        body = [r for r in self.windows if r != plan.last_step]
        return min(body, key=lambda r: (abs(r - step), r))

    def iter_spans(self) -> Iterator[Span]:
        """Spans of the whole generation, built step by step (constant memory)."""
        plan = self.graph.generation
        assert plan is not None
        yield from self.prefix.timeline().spans
        start = self.prefix.makespan_us
        for step in plan.steps:
            rep = self._representative(step)
            win = self.windows[rep]
            shift_id = (step - rep) * plan.op_shift
            base = win.result.makespan_us - win.increment_us  # the end of the step before, in the window
            for sp in win.result.timeline().spans:
                if sp.step != rep:
                    continue
                update: dict[str, object] = {"step": step, "start_us": sp.start_us - base + start}
                if sp.op_id is not None:
                    update["op_id"] = sp.op_id + shift_id
                yield sp.model_copy(update=update)
            start += self.increments_us[step]

    def timeline(self) -> Timeline:
        """The whole generation's timeline (built now: for long generations, prefer :meth:`iter_spans`)."""
        tl = self.prefix.timeline()
        return tl.model_copy(update={"spans": tuple(self.iter_spans()), "wall_us": self.makespan_us})


def _window_graph(graph: OpGraph, first: int, last: int) -> OpGraph:
    plan = graph.generation
    assert plan is not None
    ops, edges = plan.window(first, last)
    es = tuple(Edge.model_construct(src=s, dst=d, kind=EdgeKind(k), tensor=t) for s, d, k, t in edges)
    return _graph(graph, tuple(ops), es)


def _graph(graph: OpGraph, ops: tuple[OpBase, ...], edges: tuple[Edge, ...]) -> OpGraph:
    """A plain graph of ``ops`` and ``edges`` with ``graph``'s metadata (they come from it: not validated again)."""
    fields: dict[str, Any] = {"metadata": graph.metadata, "ops": ops, "edges": edges}
    return OpGraph.model_construct(**fields)


def representative_steps(first: int, last: int, max_windows: int = MAX_WINDOWS) -> list[int]:
    """The steps to simulate: all of ``first..last`` when few, else ``max_windows`` spread evenly plus the last."""
    steps = list(range(first, last + 1))
    if len(steps) <= max_windows + 1:
        return steps
    body = steps[:-1]
    picks = {body[round(i * (len(body) - 1) / (max_windows - 1))] for i in range(max_windows)}
    return sorted({*picks, last})


def simulate_generation(
    graph: OpGraph,
    hardware: HardwareSpec,
    cost_model: CostModel,
    config: SimulationConfig | None = None,
    *,
    max_windows: int = MAX_WINDOWS,
) -> GenerationSimulation:
    """Simulate a planned generate graph from its recorded part and a few step windows."""
    from simulators.api import simulate

    plan = graph.generation
    if plan is None:
        raise SimulationError(
            "the graph has no generation plan", hint="simulate it with simulators.simulate (opgraph simulate)"
        )
    with paused_gc():
        prefix = simulate(_graph(graph, graph.recorded_ops, graph.recorded_edges), hardware, cost_model, config)
        windows: dict[int, StepWindow] = {}
        for step in representative_steps(plan.first_step, plan.last_step, max_windows):
            two = simulate(_window_graph(graph, step - 1, step), hardware, cost_model, config)
            # Step k-1 is issued first and runs first: where it ends in the window is where it would end alone.
            first = plan.first_id(step)
            spans = two.timeline().spans
            before = max((sp.end_us for sp in spans if sp.op_id is not None and sp.op_id < first), default=0.0)
            windows[step] = StepWindow(step, two.makespan_us - before, two)
    increments: dict[int, float] = {}
    body = sorted(s for s in windows if s != plan.last_step)
    for step in plan.steps:
        if step in windows:
            increments[step] = windows[step].increment_us
            continue
        lo = max(s for s in body if s < step)
        hi = min(s for s in body if s > step)
        a, b = windows[lo].increment_us, windows[hi].increment_us
        increments[step] = a + (b - a) * (step - lo) / (hi - lo)
    notes = [
        f"decode steps {plan.first_step}..{plan.last_step} simulated as {len(windows)} step windows "
        f"(the others interpolated between them)"
    ]
    return GenerationSimulation(graph, prefix, windows, increments, notes)
