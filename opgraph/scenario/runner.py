"""Run a scenario end to end: capture, simulate (sweep), replay, compare, check, export.

:func:`run_scenario` resolves everything the scenario names before any long work (so a typo in a
hardware name fails in a second, naming the file and the field), then for each phase captures (or
loads) the graph, checks operator coverage, simulates each engine count, compares with the measured
timeline; replays the unique ops when asked; evaluates every expectation; and writes every artefact
into one output folder:

``<phase>.graph.json.gz``, ``<phase>.<N>eng.timeline.json.gz``, ``<phase>.coverage.txt``,
``replay.jsonl``, ``trace.perfetto.json.gz``, ``report.html`` and ``summary.json``.

Torch is imported only when a phase is captured or ops are replayed.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgraph.ir import OpGraph, OpgraphError, OpKind, Timeline, save_graph, save_model, save_timeline
from opgraph.scenario.folder import SUMMARY_FILE, check_run_folder, staged_folder
from opgraph.scenario.model import (
    Bound,
    Expectations,
    PhaseSpec,
    Scenario,
    ScenarioError,
    load_scenario,
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

if TYPE_CHECKING:
    from hardware import CostModel, HardwareSpec
    from opgraph.compare import Comparison
    from simulators import SimulationConfig, SimulationResult
    from validators.coverage import CoverageReport, Expectation

Progress = Callable[[str, int, int], None]
"""Called with a description of the step starting, the steps done and the steps in all."""

REPORT_FILE = "report.html"
TRACE_FILE = "trace.perfetto.json.gz"
REPLAY_FILE = "replay.jsonl"

MAX_REPORT_TIMELINES = 8
"""Above this many simulated timelines, the report and trace keep only each phase's recommended count."""

FAILED_REPLAY = frozenset({"error", "oom", "mismatch"})
"""Replay statuses that count against ``replay_failures``."""


@dataclass
class _Resolved:
    """What the scenario names, loaded and checked."""

    hardware: HardwareSpec
    cost_model: CostModel
    expectations: dict[str, Expectation | None]
    graphs: dict[str, OpGraph]


@dataclass
class _PhaseRun:
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


class ScenarioRun:
    """One run of a scenario into an output folder; :meth:`run` returns the :class:`ScenarioSummary`."""

    def __init__(
        self,
        scenario: Scenario,
        out_dir: str | Path,
        *,
        path: str | Path | None = None,
        base_dir: str | Path | None = None,
        progress: Progress | None = None,
        reports: bool = True,
    ) -> None:
        self.scenario = scenario
        self.path = Path(path) if path is not None else None
        self.file = str(self.path) if self.path is not None else "scenario"
        if base_dir is not None:
            self.base = Path(base_dir)
        else:
            self.base = self.path.resolve().parent if self.path is not None else Path.cwd()
        self.out = Path(out_dir)
        self.progress = progress
        self.reports = reports
        self.artefacts: list[str] = []
        self._done = 0
        s = scenario
        self._total = 1 + 2 * len(s.phases) + (1 if s.replay else 0) + (1 if reports else 0)

    # ------------------------------------------------------------ helpers
    def _step(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text, self._done, self._total)
        self._done += 1

    def _err(self, exc: OpgraphError, field: str) -> ScenarioError:
        """``exc`` as a scenario error naming the file and the field."""
        return ScenarioError(exc.message, where=f"{self.file}: {field}", hint=exc.hint)

    def path_of(self, text: str) -> Path:
        """A path named in the scenario, relative to the scenario file."""
        p = Path(text).expanduser()
        return p if p.is_absolute() else self.base / p

    def _maybe_path(self, text: str, suffixes: tuple[str, ...]) -> str:
        """``text`` resolved against the scenario folder when it names a file there (or has a file suffix)."""
        rel = self.path_of(text)
        if rel.exists() or text.endswith(suffixes):
            return str(rel)
        return text  # a preset, catalog name or hub id (``org/name``)

    def _cost_spec(self, spec: str) -> str:
        head, sep, cls = spec.rpartition(":")
        if sep and head.endswith(".py"):
            return f"{self.path_of(head)}:{cls}"
        if spec.endswith((".json", ".json.gz", ".toml")):
            return str(self.path_of(spec))
        return spec

    def _write(self, name: str) -> Path:
        if name not in self.artefacts:
            self.artefacts.append(name)
        return self.out / name

    # ------------------------------------------------------------ resolve
    def resolve(self) -> _Resolved:
        """Load and check everything the scenario names; :class:`ScenarioError` names the field at fault."""
        from hardware import load_hardware, resolve_cost_model
        from simulators.policies import get_policy

        s = self.scenario
        try:
            hw = load_hardware(self._maybe_path(s.hardware.name, (".toml", ".json", ".gz")))
        except OpgraphError as exc:
            raise self._err(exc, "hardware.name") from None
        try:
            cost_model = resolve_cost_model(self._cost_spec(s.hardware.cost_model), **s.hardware.cost_options)
        except OpgraphError as exc:
            raise self._err(exc, "hardware.cost_model") from None
        except TypeError as exc:
            raise ScenarioError(
                f"the cost model does not take these options ({exc})", where=f"{self.file}: hardware.cost_options"
            ) from None
        try:
            get_policy(s.simulation.policy)
        except OpgraphError as exc:
            raise self._err(exc, "simulation.policy") from None
        if s.simulation.tp > 1:
            try:
                from opgraph.transforms import shard_tensor_parallel  # noqa: F401
            except ImportError:
                raise ScenarioError(
                    "tensor parallelism needs opgraph.transforms.shard_tensor_parallel, which this install lacks",
                    where=f"{self.file}: simulation.tp",
                ) from None
        expectations: dict[str, Expectation | None] = {}
        for i, p in enumerate(s.phases):
            ops = s.expectations(p).operators
            where = (
                f"phases[{i}].expect.operators" if p.expect and p.expect.operators is not None else "expect.operators"
            )
            expectations[p.label] = self._expectation(ops, where) if ops not in (None, "auto") else None
        graphs: dict[str, OpGraph] = {}
        for i, p in enumerate(s.phases):
            if p.graph is not None:
                from opgraph.ir import load_graph

                try:
                    graphs[p.label] = load_graph(self.path_of(p.graph))
                except OpgraphError as exc:
                    raise self._err(exc, f"phases[{i}].graph") from None
            if p.measured is not None and not self.path_of(p.measured).exists():
                raise ScenarioError(
                    f"no such measured timeline {str(self.path_of(p.measured))!r}",
                    where=f"{self.file}: phases[{i}].measured",
                )
        if s.model is not None and any(p.graph is None for p in s.phases):
            from opgraph.capture.sources import resolve

            try:
                resolve(self._maybe_path(s.model.source, (".json",)))
            except OpgraphError as exc:
                raise self._err(exc, "model.source") from None
        return _Resolved(hw, cost_model, expectations, graphs)

    def _expectation(self, ops: str | list[str] | None, where: str) -> Expectation | None:
        from validators.coverage import Expectation, builtin_operators, load_expectation

        if ops is None:
            return None
        if isinstance(ops, list):
            known = builtin_operators()
            unknown = [o for o in ops if o not in known]
            if unknown:
                raise ScenarioError(
                    f"unknown operator(s) {', '.join(unknown)}",
                    where=f"{self.file}: {where}",
                    hint=f"one of: {', '.join(sorted(known))}",
                )
            return Expectation(family="scenario", required=tuple(ops), operators=dict(known))
        try:
            name = str(self.path_of(ops)) if ops.endswith(".toml") else ops
            return load_expectation(name)
        except OpgraphError as exc:
            raise self._err(exc, where) from None

    # ------------------------------------------------------------ phases
    def _graph(self, i: int, p: PhaseSpec, resolved: _Resolved) -> OpGraph:
        if p.label in resolved.graphs:
            return resolved.graphs[p.label]
        from opgraph.capture import capture

        m = self.scenario.model
        assert m is not None  # checked by the model validator
        try:
            return capture(
                self._maybe_path(m.source, (".json",)),
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
            raise self._err(exc, f"phases[{i}]") from None

    def _config(self) -> SimulationConfig:
        from simulators import HostConfig, HostMode, SimulationConfig

        sim = self.scenario.simulation
        base = SimulationConfig.standard(
            sim.engine_counts[0],
            copy_engines=sim.copy_engines,
            links=sim.links,
            policy=sim.policy,
            tp=sim.tp,
            skip_uncosted=sim.skip_uncosted,
            host=HostConfig(mode=HostMode(sim.host_mode), per_op_us=sim.host_us),
        )
        return base

    def _simulate(self, i: int, p: PhaseSpec, graph: OpGraph, resolved: _Resolved) -> _PhaseRun:
        from simulators import cost_problem, default_host_us, run_problem, sweep_engines, uncosted_error

        sim = self.scenario.simulation
        config = self._config()
        if sim.tp > 1 and not any(o.kind is OpKind.COLLECTIVE for o in graph.ops):
            from opgraph.transforms import shard_tensor_parallel

            try:
                graph = shard_tensor_parallel(graph, sim.tp)
            except OpgraphError as exc:
                raise self._err(exc, "simulation.tp") from None
        problem, model_name, _ = cost_problem(graph, resolved.cost_model, resolved.hardware)
        if problem.uncosted and not sim.skip_uncosted:
            raise self._err(uncosted_error(problem, model_name), "hardware.cost_model")
        common: dict[str, Any] = {
            "host_per_op_us": default_host_us(config, resolved.hardware),
            "hardware_name": resolved.hardware.name,
            "cost_model_name": model_name,
        }
        counts = sim.engine_counts
        if len(counts) == 1:
            results = {counts[0]: run_problem(problem, config.with_engines(counts[0]), **common)}
            recommended = counts[0]
        else:
            sweep, results = sweep_engines(problem, config, counts, tolerance=sim.tolerance, **common)
            recommended = sweep.recommended
        rows: list[SweepRow] = []
        timelines: dict[int, Timeline] = {}
        for n, res in results.items():
            st = res.stats()
            tl = res.timeline()
            label = f"{p.label} {n} eng" + (f" tp{sim.tp}" if sim.tp > 1 else "")
            tl = tl.model_copy(update={"source": tl.source.model_copy(update={"name": label})})
            timelines[n] = tl
            name = f"{p.label}.{n}eng.timeline.json.gz"
            save_timeline(tl, self._write(name))
            rows.append(
                SweepRow(
                    engines=n,
                    makespan_us=st.makespan_us,
                    speedup=st.speedup,
                    utilization=_compute_utilization(res),
                    timeline=name,
                )
            )
        cp = results[counts[0]].stats().critical_path.length_us
        return _PhaseRun(p, graph, results, recommended, rows, cp, timelines=timelines)

    def _coverage(self, run: _PhaseRun, expectation: Expectation | None, auto: bool) -> None:
        from validators.coverage import auto_expectation, format_report, verify_graph

        if expectation is None and not auto:
            return
        try:
            exp = expectation if expectation is not None else auto_expectation(run.graph)
        except OpgraphError as exc:
            raise self._err(exc, "expect.operators") from None
        report = verify_graph(run.graph, exp, source=f"{run.spec.label}.graph.json.gz", auto=auto)
        run.coverage, run.coverage_family = report, exp.family
        from opgraph.ir import atomic_write

        with atomic_write(self._write(f"{run.spec.label}.coverage.txt")) as f:
            f.write((format_report(report) + "\n").encode())

    def _compare(self, i: int, run: _PhaseRun) -> None:
        p = run.spec
        if p.measured is None:
            return
        from opgraph.compare import JoinMode, compare_timelines
        from opgraph.compare.loading import load_any_timeline

        try:
            measured = load_any_timeline(self.path_of(p.measured))
        except OpgraphError as exc:
            raise self._err(exc, f"phases[{i}].measured") from None
        cmp = self.scenario.compare
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
            raise self._err(exc, f"phases[{i}].measured") from None
        run.measured, run.compare_engines = measured, n

    # ------------------------------------------------------------ replay
    def _replay(self, runs: list[_PhaseRun]) -> ReplaySummary | None:
        rp = self.scenario.replay
        if rp is None:
            return None
        from validators import ReplayOptions, TimingConfig, run_replay

        timing = TimingConfig(
            warmup_ms=5.0,
            min_warmup=1,
            min_samples=min(3, rp.max_samples),
            max_samples=rp.max_samples,
            max_time_s=rp.max_time_s,
        )
        kinds = set(rp.kinds)
        try:
            run = run_replay(
                [r.graph for r in runs],
                device=rp.device,
                out=self._write(REPLAY_FILE),
                options=ReplayOptions(timing=timing, check=rp.check, energy=False),
                select=(lambda c: c.op.kind in kinds) if kinds else None,
                limit=rp.max_configs,
            )
        except OpgraphError as exc:
            raise self._err(exc, "replay") from None
        statuses = Counter(r.status.value for r in run.results)
        return ReplaySummary(
            device=rp.device,
            device_name=run.device_name,
            configs=len(run.configs),
            total_configs=run.total_configs,
            statuses=dict(sorted(statuses.items())),
            results=REPLAY_FILE,
        )

    # ------------------------------------------------------------ run
    def run(self) -> ScenarioSummary:
        """Run every step and write the artefacts; returns the summary (also in ``summary.json``).

        The artefacts are written into a fresh folder beside the output folder, which replaces the
        output folder only once the run has finished (see :mod:`opgraph.scenario.folder`): an
        interrupted run leaves an earlier run's folder as it was.
        """
        t0 = time.perf_counter()
        self._step("resolving hardware, cost model and model")
        check_run_folder(self.out)
        resolved = self.resolve()
        final = self.out
        try:
            with staged_folder(final) as partial:
                self.out = partial
                summary = self._run(resolved, t0)
        finally:
            self.out = final
        if self.progress is not None:
            self.progress("done", self._total, self._total)
        return summary

    def _run(self, resolved: _Resolved, t0: float) -> ScenarioSummary:
        s = self.scenario
        runs: list[_PhaseRun] = []
        for i, p in enumerate(s.phases):
            what = f"loading {p.label}" if p.label in resolved.graphs else f"capturing {p.label}"
            self._step(what)
            graph = self._graph(i, p, resolved)
            save_graph(graph, self._write(f"{p.label}.graph.json.gz"))
            counts = s.simulation.engine_counts
            self._step(f"simulating {p.label} on {resolved.hardware.name}, engines {_counts_text(counts)}")
            run = self._simulate(i, p, graph, resolved)
            exp = s.expectations(p)
            self._coverage(run, resolved.expectations[p.label], exp.operators == "auto")
            self._compare(i, run)
            runs.append(run)
        if s.replay is not None:
            self._step(f"replaying unique ops on {s.replay.device}")
        replay = self._replay(runs)
        checks = [c for run in runs for c in self._check_phase(run)]
        checks += self._check_replay(replay)
        if self.reports:
            self._step("writing the trace and the report")
        phases = tuple(self._phase_result(r) for r in runs)
        summary = ScenarioSummary(
            name=scenario_name(s, self.path),
            file=self.file,
            description=s.description,
            hardware=resolved.hardware.name,
            cost_model=runs[0].results[runs[0].recommended].cost_model_name if runs else s.hardware.cost_model,
            policy=s.simulation.policy,
            host=s.simulation.host_mode,
            tp=s.simulation.tp,
            phases=phases,
            replay=replay,
            expectations=tuple(checks),
            passed=all(c.passed for c in checks),
            artefacts=(),
        )
        if self.reports:
            self._export(runs, summary)
        self._write(SUMMARY_FILE)
        summary = summary.model_copy(update={"artefacts": tuple(self.artefacts), "elapsed_s": time.perf_counter() - t0})
        save_model(summary, self.out / SUMMARY_FILE)
        return summary

    # ------------------------------------------------------------ results
    def _phase_result(self, run: _PhaseRun) -> PhaseResult:
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
                measured=str(self.path_of(run.spec.measured or "")),
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

    def _check_phase(self, run: _PhaseRun) -> list[ExpectationResult]:
        exp: Expectations = self.scenario.expectations(run.spec)
        label = run.spec.label
        out: list[ExpectationResult] = []

        def add(check: str, passed: bool, value: float | str | None, limit: str, message: str) -> None:
            out.append(
                ExpectationResult(
                    id=f"{label}/{check}",
                    phase=label,
                    check=check,
                    passed=passed,
                    value=value,
                    limit=limit,
                    message=message,
                )
            )

        if run.coverage is not None:
            cov = run.coverage
            missing = cov.missing_required
            req = sum(o.required for o in cov.operators)
            add(
                "operators",
                not missing,
                ", ".join(missing) if missing else f"{req} of {req}",
                f"family {run.coverage_family}",
                f"missing required operators: {', '.join(missing)} (see {label}.coverage.txt)"
                if missing
                else f"all {req} required operators of {run.coverage_family} are present",
            )
        rows = {r.engines: r for r in run.rows}
        for check, bound, attr, fmt in (
            ("makespan_us", exp.makespan_us, "makespan_us", _fmt_us),
            ("utilization", exp.utilization, "utilization", _fmt_pct),
            ("speedup", exp.speedup, "speedup", _fmt_x),
        ):
            if bound is None:
                continue
            n = bound.engines or run.recommended
            value = float(getattr(rows[n], attr))
            ok, limit = _within(value, bound, fmt)
            noun = check.removesuffix("_us")
            engines = f"{n} engine" + ("s" if n > 1 else "")
            add(check, ok, value, limit, f"{noun} {fmt(value)} ({engines}) {'is' if ok else 'is not'} {limit}")
        if exp.recommended_engines is not None:
            ok, limit = _within(float(run.recommended), exp.recommended_engines, lambda v: f"{v:g}")
            add(
                "recommended_engines",
                ok,
                float(run.recommended),
                limit,
                f"the sweep recommends {run.recommended} engine(s), {'within' if ok else 'outside'} {limit}",
            )
        if exp.max_error is not None and run.comparison is not None:
            c = run.comparison
            values: dict[str, float | None] = {
                "gpu_time": abs(c.row("gpu_time").rel_error),
                "wall_time": abs(c.row("wall_time").rel_error),
                "median_op": c.median_abs_rel_error,
            }
            for key in ("gpu_time", "wall_time", "median_op"):
                limit_value = getattr(exp.max_error, key)
                if limit_value is None:
                    continue
                v = values[key]
                ok = v is not None and math.isfinite(v) and v <= limit_value
                limit = f"<= {limit_value * 100:g}%"
                shown = "n/a" if v is None else f"{v * 100:.1f}%"
                add(
                    f"max_error.{key}",
                    ok,
                    v,
                    limit,
                    f"|{key} error| {shown} against the measured timeline ({run.compare_engines} engine(s)) "
                    f"{'is' if ok else 'is not'} {limit}",
                )
        return out

    def _check_replay(self, replay: ReplaySummary | None) -> list[ExpectationResult]:
        limits = [
            e.replay_failures
            for e in (self.scenario.expect, *(p.expect for p in self.scenario.phases))
            if e is not None and e.replay_failures is not None
        ]
        if replay is None or not limits:
            return []
        limit = min(limits)
        bad = sum(n for st, n in replay.statuses.items() if st in FAILED_REPLAY)
        ok = bad <= limit
        detail = ", ".join(f"{st} {n}" for st, n in replay.statuses.items())
        return [
            ExpectationResult(
                id="replay/replay_failures",
                phase="replay",
                check="replay_failures",
                passed=ok,
                value=float(bad),
                limit=f"<= {limit}",
                message=f"{bad} of {replay.configs} replayed configs failed (error, oom or mismatch; {detail}), "
                f"{'within' if ok else 'above'} the limit {limit}",
            )
        ]

    # ------------------------------------------------------------ export
    def _export(self, runs: list[_PhaseRun], summary: ScenarioSummary) -> None:
        from opgraph.export import ReportTable, write_html_report, write_perfetto

        total = sum(len(r.timelines) for r in runs)
        timelines: list[Timeline] = []
        for r in runs:
            keep = r.timelines if total <= MAX_REPORT_TIMELINES else {r.recommended: r.timelines[r.recommended]}
            timelines.extend(keep[n] for n in sorted(keep))
        single = len(runs) == 1
        graph = runs[0].graph if single else None
        measured = [r.measured for r in runs if r.measured is not None]
        tp = self.scenario.simulation.tp
        if tp > 1:
            trace_tls = [
                t
                for r in runs
                for n in sorted(r.timelines)
                if total <= MAX_REPORT_TIMELINES or n == r.recommended
                for t in _renamed_ranks(r.results[n], r.timelines[n].source.name)
            ]
        else:
            trace_tls = list(timelines)
        write_perfetto([*trace_tls, *measured], self._write(TRACE_FILE), graph=graph)

        tables = [_expectation_table(summary)]
        for r in runs:
            if len(r.rows) > 1:
                tables.append(_sweep_table(r))
        if summary.replay is not None:
            rp = summary.replay
            tables.append(
                ReportTable(
                    title=f"Replay on {rp.device} ({rp.device_name})",
                    columns=("status", "configs"),
                    rows=tuple((k, v) for k, v in rp.statuses.items()),
                    note=f"{rp.configs} of {rp.total_configs} unique configs replayed; results in {rp.results}",
                )
            )
        if single:
            timelines.extend(measured)
        else:
            from opgraph.compare import comparison_tables

            for r in runs:
                if r.comparison is None:
                    continue
                for title, cols, rows in comparison_tables(r.comparison):
                    tables.append(
                        ReportTable(
                            title=f"{r.spec.label}: {title}",
                            columns=tuple(cols),
                            rows=tuple(tuple(row) for row in rows),
                        )
                    )
        title = f"opgraph scenario {summary.name}: {'passed' if summary.passed else 'FAILED'}"
        write_html_report(self._write(REPORT_FILE), timelines=timelines, graph=graph, tables=tables, title=title)


# ---------------------------------------------------------------- free helpers
def _compute_utilization(res: SimulationResult) -> float:
    st = res.stats()
    group = res.config.compute_group.name
    comp = [e for e in st.engines if e.group == group and e.rank == 0]
    return sum(e.utilization for e in comp) / len(comp) if comp else 0.0


def _renamed_ranks(res: SimulationResult, name: str) -> list[Timeline]:
    out = []
    for r, tl in enumerate(res.rank_timelines()):
        out.append(tl.model_copy(update={"source": tl.source.model_copy(update={"name": f"{name} rank{r}"})}))
    return out


def _counts_text(counts: tuple[int, ...]) -> str:
    if len(counts) > 2 and counts == tuple(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}..{counts[-1]}"
    return ", ".join(map(str, counts))


def _fmt_us(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.4g} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.4g} ms"
    return f"{v:.4g} us"


def _fmt_pct(v: float) -> str:
    return f"{v * 100:.1f}%"


def _fmt_x(v: float) -> str:
    return f"{v:.3g}x"


def _within(value: float, bound: Bound, fmt: Callable[[float], str]) -> tuple[bool, str]:
    ok = (bound.min is None or value >= bound.min) and (bound.max is None or value <= bound.max)
    if bound.min is not None and bound.max is not None:
        limit = f"within [{fmt(bound.min)}, {fmt(bound.max)}]"
    elif bound.min is not None:
        limit = f">= {fmt(bound.min)}"
    else:
        assert bound.max is not None
        limit = f"<= {fmt(bound.max)}"
    return ok, limit


def _expectation_table(summary: ScenarioSummary) -> Any:
    from opgraph.export import ReportTable

    rows = tuple((e.phase, e.check, "pass" if e.passed else "FAIL", e.limit, e.message) for e in summary.expectations)
    failed = len(summary.failures)
    note = f"{failed} of {len(rows)} expectations failed" if failed else f"all {len(rows)} expectations hold"
    return ReportTable(
        title="Expectations",
        columns=("phase", "check", "result", "limit", "detail"),
        rows=rows,
        note=note,
        numeric=(False,) * 5,
    )


def _sweep_table(run: _PhaseRun) -> Any:
    from opgraph.export import ReportTable

    best = min(r.makespan_us for r in run.rows)
    return ReportTable(
        title=f"{run.spec.label}: engine sweep",
        columns=("engines", "makespan us", "vs best", "speedup", "utilisation"),
        rows=tuple(
            (
                f"{r.engines}{' *' if r.engines == run.recommended else ''}",
                round(r.makespan_us, 3),
                f"+{(r.makespan_us / best - 1) * 100:.1f}%" if best else "-",
                round(r.speedup, 3),
                f"{r.utilization * 100:.0f}%",
            )
            for r in run.rows
        ),
        note=f"* recommended: the smallest count within the tolerance of the best makespan; "
        f"critical path {_fmt_us(run.critical_path_us)}",
        numeric=(True, True, True, True, True),
    )


def run_scenario(
    scenario: Scenario | str | Path,
    out_dir: str | Path,
    *,
    base_dir: str | Path | None = None,
    progress: Progress | None = None,
    reports: bool = True,
) -> ScenarioSummary:
    """Run a scenario (a :class:`Scenario` or a ``.scenario.toml`` path) and write its artefacts to ``out_dir``.

    Paths in the scenario are relative to its file (or ``base_dir``, default the current folder for
    a :class:`Scenario` object). Raises :class:`ScenarioError` (or another
    :class:`~opgraph.ir.OpgraphError`) on bad input; failed expectations are in the summary, not raised.
    """
    if isinstance(scenario, Scenario):
        return ScenarioRun(scenario, out_dir, base_dir=base_dir, progress=progress, reports=reports).run()
    path = Path(scenario)
    loaded = load_scenario(path)
    return ScenarioRun(loaded, out_dir, path=path, base_dir=base_dir, progress=progress, reports=reports).run()


def planned_checks(scenario: Scenario) -> list[str]:
    """The ids of the expectations a run of ``scenario`` reports, in order (for test collection)."""
    ids: list[str] = []
    for p in scenario.phases:
        exp = scenario.expectations(p)
        if exp.operators is not None:
            ids.append(f"{p.label}/operators")
        for check in ("makespan_us", "utilization", "speedup", "recommended_engines"):
            if getattr(exp, check) is not None:
                ids.append(f"{p.label}/{check}")
        if exp.max_error is not None and p.measured:
            for key in ("gpu_time", "wall_time", "median_op"):
                if getattr(exp.max_error, key) is not None:
                    ids.append(f"{p.label}/max_error.{key}")
    if scenario.replay is not None and any(
        e is not None and e.replay_failures is not None for e in (scenario.expect, *(p.expect for p in scenario.phases))
    ):
        ids.append("replay/replay_failures")
    return ids


def failure_lines(summary: ScenarioSummary) -> list[str]:
    """One line per failed expectation: ``prefill makespan_us: ...``."""
    return [f"{e.phase} {e.check}: {e.message}" for e in summary.failures]
