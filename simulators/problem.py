"""``SchedulingProblem``: a graph flattened to arrays the scheduler walks (durations, successors,
in-degrees, routing facts), plus its static analysis (topological order, bottom levels, critical path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hardware.base import Bound, Cost, peak_times
from hardware.spec import HardwareSpec
from opgraph.ir import OpBase, OpGraph, OpKind
from opgraph.ir.algorithms import adjacency, bottom_levels, generations, longest_path


@dataclass(frozen=True)
class UncostedOp:
    """An op the cost model declined."""

    index: int
    """Program index."""
    op_id: int
    kind: str
    definition: str
    reason: str


@dataclass
class SchedulingProblem:
    """The arrays a schedule is computed from; index ``i`` is the ``i``-th op in program order.

    Build it with :meth:`from_costs` or :meth:`from_durations`; it raises
    :class:`~opgraph.ir.CycleError` when the edges form a cycle.
    """

    graph: OpGraph
    """The graph."""
    dur_us: list[float]
    """Device time of each op (0 for free and uncosted ops)."""
    bound: list[str | None]
    """What bounds each op (``None`` for uncosted ops)."""
    free: list[bool]
    """Ops that occupy no engine: views (bound ``free``) and skipped uncosted ops."""
    succ: list[list[int]]
    """Successor indices (deduplicated)."""
    indeg: list[int]
    """Predecessor count of each op."""
    topo: list[int]
    """A topological order: Kahn's generations, each in program order (as ``topological_order``)."""
    uncosted: list[UncostedOp] = field(default_factory=list)
    """Ops with no cost, in program order."""
    kinds: list[OpKind] = field(default_factory=list)
    """Kind of each op."""
    host_us: list[float | None] = field(default_factory=list)
    """Host time to issue each op as the cost model measured it (a calibrated table), else ``None``."""
    issue_basis: tuple[float, str] | None = None
    """The host's issue time per aten call (us) when the cost model measured ``host_us``, and where that
    is written (a device profile's ``aten_issue_us`` and its file name); ``None`` when unknown."""
    framework_us: list[float] = field(default_factory=list)
    """Host time the framework spends before each op, as measured at capture (``op.host_gap_us``), else 0."""
    compute_us: list[float] = field(default_factory=list)
    """Each op's FLOPs at the device's peak (:func:`~hardware.base.peak_times`); empty when the
    problem was built without hardware (then ops running at once do not share the device)."""
    memory_us: list[float] = field(default_factory=list)
    """Each op's bytes at the device's full memory bandwidth; empty without hardware."""
    _bottom: list[float] | None = field(default=None, repr=False)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_costs(
        cls,
        graph: OpGraph,
        costs: Mapping[int, Cost],
        uncosted: Mapping[int, str] | None = None,
        *,
        hardware: HardwareSpec | None = None,
    ) -> SchedulingProblem:
        """From per-op :class:`~hardware.base.Cost` (by op id); ``uncosted`` maps op id to the reason.

        With ``hardware`` the problem knows what each op takes of the device, so ops running at
        once share it (unless the simulation declares independent engines).
        """
        uncosted = uncosted or {}
        n = len(graph.ops)
        dur = [0.0] * n
        bound: list[str | None] = [None] * n
        free = [False] * n
        missing: list[UncostedOp] = []
        free_bound = Bound.FREE
        seen: dict[int, tuple[float, str, bool]] = {}  # costs of equal ops are one shared object
        host: list[float | None] = [None] * n
        for i, op in enumerate(graph.ops):
            c = costs.get(op.id)
            if c is None:
                reason = uncosted.get(op.id, "no cost given")
                missing.append(UncostedOp(i, op.id, op.kind.value, op.definition, reason))
                free[i] = True
                continue
            facts = seen.get(id(c))
            if facts is None:
                facts = seen[id(c)] = (c.seconds * 1e6, c.bound.value, c.bound is free_bound)
            dur[i], bound[i], free[i] = facts
            if c.host_s is not None:
                host[i] = c.host_s * 1e6
        problem = cls._build(graph, dur, bound, free, missing, hardware)
        problem.host_us = host
        return problem

    @classmethod
    def from_durations(
        cls,
        graph: OpGraph,
        durations_us: Mapping[int, float] | Callable[[OpBase], float],
        *,
        hardware: HardwareSpec | None = None,
    ) -> SchedulingProblem:
        """From plain durations in microseconds (by op id, or a function of the op); views are free.

        With ``hardware`` ops running at once share its peaks, as in :meth:`from_costs`.
        """
        get = durations_us if callable(durations_us) else (lambda op: durations_us[op.id])
        dur = [float(get(op)) for op in graph.ops]
        free = [op.kind is OpKind.VIEW for op in graph.ops]
        bound: list[str | None] = ["free" if f else "compute" for f in free]
        for i, f in enumerate(free):
            if f:
                dur[i] = 0.0
        return cls._build(graph, dur, bound, free, [], hardware)

    @classmethod
    def _build(
        cls,
        graph: OpGraph,
        dur: list[float],
        bound: list[str | None],
        free: list[bool],
        uncosted: list[UncostedOp],
        hardware: HardwareSpec | None = None,
    ) -> SchedulingProblem:
        ops = graph.ops
        succ, indeg = adjacency(ops, graph.edges)
        topo = [i for gen in generations(succ, indeg, [op.id for op in ops]) for i in gen]
        kinds = [op.kind for op in ops]
        framework = [op.host_gap_us or 0.0 for op in ops]
        problem = cls(graph, dur, bound, free, succ, indeg, topo, uncosted, kinds, framework_us=framework)
        if hardware is not None:
            problem.compute_us, problem.memory_us = _device_work_us(ops, free, hardware)
        return problem

    # ---------------------------------------------------------------- analysis
    def __len__(self) -> int:
        return len(self.dur_us)

    @property
    def ops(self) -> tuple[OpBase, ...]:
        """The ops in program order."""
        return self.graph.ops

    def bottom_levels(self) -> list[float]:
        """Longest time from each op's start to the end of the graph (its own time included)."""
        if self._bottom is None:
            self._bottom = bottom_levels(self.succ, self.topo, self.dur_us)
        return self._bottom

    def critical_path(self, dur_us: Sequence[float] | None = None) -> tuple[float, list[int]]:
        """Length and program indices of the longest chain of dependent ops (by ``dur_us``)."""
        return longest_path(self.succ, self.topo, self.dur_us if dur_us is None else dur_us)

    @property
    def serial_us(self) -> float:
        """Sum of all op times (what one engine with no host cost would take)."""
        return sum(self.dur_us)


def _device_work_us(ops: Sequence[OpBase], free: list[bool], hw: HardwareSpec) -> tuple[list[float], list[float]]:
    """Each op's :func:`~hardware.base.peak_times` in microseconds (0 for free ops)."""
    compute = [0.0] * len(ops)
    memory = [0.0] * len(ops)
    memo: dict[tuple[object, ...], tuple[float, float]] = {}
    for i, op in enumerate(ops):
        if free[i]:
            continue
        key = (op.kind, op.dtype, op.flops, op.bytes_read, op.bytes_written)
        work = memo.get(key)
        if work is None:
            c, m = peak_times(op, hw)
            work = memo[key] = (c * 1e6, m * 1e6)
        compute[i], memory[i] = work
    return compute, memory
