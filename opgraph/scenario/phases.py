"""The per-phase steps of a run: get the graph, simulate it (through :func:`opgraph.study.run_study`),
check operator coverage, compare with the measured timeline, and summarise the phase.

Each step is a function of the :class:`~opgraph.scenario.context.RunContext` and the phase's
:class:`PhaseRun`, which collects what the steps found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opgraph.ir import OpGraph, OpgraphError, OpKind, Timeline, save_timeline
from opgraph.scenario.context import RunContext
from opgraph.scenario.model import PhaseSpec
from opgraph.scenario.resolve import Resolved
from opgraph.scenario.result import ComparisonSummary, CoverageSummary, PhaseResult, SweepRow

if TYPE_CHECKING:
    from opgraph.compare import Comparison
    from simulators import SimulationConfig, SimulationResult
    from validators.coverage import CoverageReport, Expectation


@dataclass
class PhaseRun:
    """One phase of a run: its graph, a simulation per engine count, and what the later steps found."""

    spec: PhaseSpec
    graph: OpGraph
    results: dict[int, SimulationResult]
    recommended: int
    rows: list[SweepRow]
    critical_path_us: float
    coverage: CoverageReport | None = None
    coverage_family: str = ""
    measured: Timeline | None = None
    comparison: Comparison | None = None
    compare_engines: int = 0
    timelines: dict[int, Timeline] = field(default_factory=dict)


def phase_graph(ctx: RunContext, i: int, p: PhaseSpec, resolved: Resolved) -> OpGraph:
    """The graph of phase ``i``: loaded from its file, or captured from the scenario's model."""
    if p.label in resolved.graphs:
        return resolved.graphs[p.label]
    from opgraph.capture import capture

    m = ctx.scenario.model
    assert m is not None  # checked by the model validator
    try:
        return capture(
            ctx.maybe_path(m.source, (".json",)),
            phase=p.phase,
            batch=p.batch,
            seq_len=p.seq_len,
            kv_len=p.kv_len,
            new_tokens=p.new_tokens,
            dtype=m.dtype,
            layers=m.layers,
            attn_impl=m.attn_impl,
            device=m.device,
            moe_skew=m.moe_skew,
        )
    except OpgraphError as exc:
        raise ctx.err(exc, f"phases[{i}]") from None


def simulation_config(ctx: RunContext) -> SimulationConfig:
    """The simulation settings of the scenario as a :class:`~simulators.SimulationConfig`."""
    from opgraph.study import study_config

    sim = ctx.scenario.simulation
    return study_config(
        sim.engine_counts[0],
        copy_engines=sim.copy_engines,
        links=sim.links,
        policy=ctx.code_spec(sim.policy),
        tp=sim.tp,
        host_mode=sim.host_mode,
        host_us=sim.host_us,
        skip_uncosted=sim.skip_uncosted,
        independent_engines=sim.independent_engines,
    )


def simulate_phase(ctx: RunContext, p: PhaseSpec, graph: OpGraph, resolved: Resolved) -> PhaseRun:
    """Simulate the phase for each engine count (sharded for TP first) and save each timeline."""
    from opgraph.study import run_study, shard_for_tp
    from simulators import UncostedOpsError

    sim = ctx.scenario.simulation
    try:
        graph, _ = shard_for_tp(graph, sim.tp)
    except OpgraphError as exc:
        raise ctx.err(exc, "simulation.tp") from None
    counts = sim.engine_counts
    try:
        study = run_study(
            graph,
            resolved.hardware,
            resolved.cost_model,
            simulation_config(ctx),
            engines=counts,
            shard=False,
            tolerance=sim.tolerance,
        )
    except UncostedOpsError as exc:
        raise ctx.err(exc, "hardware.cost_model") from None
    rows: list[SweepRow] = []
    timelines: dict[int, Timeline] = {}
    for n, res in study.results.items():
        st = res.stats()
        tl = res.timeline()
        label = f"{p.label} {n} eng" + (f" tp{sim.tp}" if sim.tp > 1 else "")
        tl = tl.model_copy(update={"source": tl.source.model_copy(update={"name": label})})
        timelines[n] = tl
        name = f"{p.label}.{n}eng.timeline.json.gz"
        save_timeline(tl, ctx.write(name))
        rows.append(
            SweepRow(
                engines=n,
                makespan_us=st.makespan_us,
                speedup=st.speedup,
                utilization=st.mean_utilization(res.config.compute_group.name),
                timeline=name,
            )
        )
    cp = study.results[counts[0]].stats().critical_path.length_us
    return PhaseRun(p, graph, study.results, study.recommended, rows, cp, timelines=timelines)


def check_coverage(ctx: RunContext, run: PhaseRun, expectation: Expectation | None, auto: bool) -> None:
    """Check the phase's graph holds the operators it should; write ``<phase>.coverage.txt``."""
    from validators.coverage import auto_expectation, format_report, verify_graph

    if expectation is None and not auto:
        return
    try:
        exp = expectation if expectation is not None else auto_expectation(run.graph)
    except OpgraphError as exc:
        raise ctx.err(exc, "expect.operators") from None
    report = verify_graph(run.graph, exp, source=f"{run.spec.label}.graph.json.gz", auto=auto)
    run.coverage, run.coverage_family = report, exp.family
    from opgraph.ir import atomic_write

    with atomic_write(ctx.write(f"{run.spec.label}.coverage.txt")) as f:
        f.write((format_report(report) + "\n").encode())


def compare_phase(ctx: RunContext, i: int, run: PhaseRun) -> None:
    """Compare the phase's simulated timeline with its measured one, when the scenario gives one."""
    p = run.spec
    if p.measured is None:
        return
    from opgraph.compare import JoinMode, compare_timelines
    from opgraph.compare.loading import load_any_timeline

    try:
        measured = load_any_timeline(ctx.path_of(p.measured))
    except OpgraphError as exc:
        raise ctx.err(exc, f"phases[{i}].measured") from None
    cmp = ctx.scenario.compare
    n = cmp.engines or min(run.results)
    predicted = run.results[n].rank_timelines()[0]
    try:
        run.comparison = compare_timelines(
            predicted,
            measured,
            join=JoinMode(cmp.join),
            graph=run.graph,
            allow_different_models=cmp.allow_different_models,
        )
    except OpgraphError as exc:
        raise ctx.err(exc, f"phases[{i}].measured") from None
    run.measured, run.compare_engines = measured, n


def phase_result(ctx: RunContext, run: PhaseRun) -> PhaseResult:
    """The phase as the summary reports it."""
    g = run.graph
    st = run.results[run.recommended].stats()
    cov = None
    if run.coverage is not None:
        cov = CoverageSummary(
            family=run.coverage_family,
            required=sum(o.required for o in run.coverage.operators),
            missing=tuple(run.coverage.missing_required),
            report=f"{run.spec.label}.coverage.txt",
        )
    cmp = None
    c = run.comparison
    if c is not None:
        cmp = ComparisonSummary(
            measured=str(ctx.path_of(run.spec.measured or "")),
            engines=run.compare_engines,
            join=c.join.value,
            matched=c.matched,
            gpu_time_error=c.row("gpu_time").rel_error,
            wall_time_error=c.row("wall_time").rel_error,
            median_op_error=c.median_abs_rel_error,
            by_kind={k.group: k.rel_error for k in c.by_kind if math.isfinite(k.rel_error)},
        )
    return PhaseResult(
        name=run.spec.label,
        phase=g.metadata.phase or run.spec.phase,
        model=g.metadata.model,
        graph=f"{run.spec.label}.graph.json.gz",
        ops=len(g.ops),
        kernel_ops=sum(1 for o in g.ops if o.kind is not OpKind.VIEW),
        flops=float(sum(o.flops for o in g.ops)),
        bytes=float(sum(o.bytes_read + o.bytes_written for o in g.ops)),
        sweep=tuple(run.rows),
        recommended_engines=run.recommended,
        critical_path_us=run.critical_path_us,
        collective_us=st.by_kind["collective"].busy_us if "collective" in st.by_kind else 0.0,
        by_kind_us={k: b.busy_us for k, b in st.by_kind.items()},
        coverage=cov,
        comparison=cmp,
        assumptions=tuple(g.metadata.assumptions),
    )
