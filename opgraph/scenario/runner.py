"""Run a scenario end to end: a pipeline of small steps, each in its own module.

:func:`run_scenario` (or :class:`ScenarioRun`) runs, in order:

1. :func:`~opgraph.scenario.resolve.resolve` - load and check everything the scenario names,
   before any long work (a typo in a hardware name fails in a second, naming the file and field);
2. per phase: :func:`~opgraph.scenario.phases.phase_graph` (load or capture),
   :func:`~opgraph.scenario.phases.simulate_phase` (through :func:`opgraph.study.run_study`),
   :func:`~opgraph.scenario.phases.check_coverage`, :func:`~opgraph.scenario.phases.compare_phase`;
3. :func:`~opgraph.scenario.replay.replay_ops` - the unique ops on a device, when asked;
4. :func:`~opgraph.scenario.checks.check_phase` / :func:`~opgraph.scenario.checks.check_replay`;
5. :func:`~opgraph.scenario.reports.write_reports` - the Perfetto trace and the HTML report;

and writes every artefact into one output folder (swapped in whole at the end, see
:mod:`opgraph.scenario.folder`): ``<phase>.graph.json.gz``, ``<phase>.<N>eng.timeline.json.gz``,
``<phase>.coverage.txt``, ``replay.jsonl``, ``trace.perfetto.json.gz``, ``report.html`` and
``summary.json``.

Torch is imported only when a phase is captured or ops are replayed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Unpack

from opgraph.ir import save_graph, save_model
from opgraph.scenario.checks import check_phase, check_replay, failure_lines, planned_checks
from opgraph.scenario.context import RunContext, ScenarioPaths
from opgraph.scenario.folder import SUMMARY_FILE, check_run_folder, staged_folder
from opgraph.scenario.model import Scenario, load_scenario, scenario_name
from opgraph.scenario.phases import PhaseRun, check_coverage, compare_phase, phase_graph, phase_result, simulate_phase
from opgraph.scenario.replay import REPLAY_FILE, replay_ops
from opgraph.scenario.reports import MAX_REPORT_TIMELINES, REPORT_FILE, TRACE_FILE, write_reports
from opgraph.scenario.resolve import Resolved, resolve
from opgraph.scenario.result import ScenarioSummary

__all__ = [
    "MAX_REPORT_TIMELINES",
    "REPLAY_FILE",
    "REPORT_FILE",
    "SUMMARY_FILE",
    "TRACE_FILE",
    "Progress",
    "ScenarioRun",
    "failure_lines",
    "planned_checks",
    "run_scenario",
]

Progress = Callable[[str, int, int], None]
"""Called with a description of the step starting, the steps done and the steps in all."""


class ScenarioRun:
    """One run of a scenario into an output folder; :meth:`run` returns the :class:`ScenarioSummary`.

    ``progress`` (settable until :meth:`run`) is told each step as it starts; ``paths`` (the
    scenario's file, the folder its paths are relative to) are :class:`~opgraph.scenario.context.ScenarioPaths`.
    """

    def __init__(
        self,
        scenario: Scenario,
        out_dir: str | Path,
        *,
        progress: Progress | None = None,
        reports: bool = True,
        **paths: Unpack[ScenarioPaths],
    ) -> None:
        self.ctx = RunContext.create(scenario, out_dir, **paths)
        self.scenario = scenario
        self.path = self.ctx.path
        self.file = self.ctx.file
        self.out = self.ctx.out
        self.progress = progress
        self.reports = reports
        self._done = 0
        self._total = (
            1
            + 2 * len(scenario.phases)
            + (1 if scenario.replay else 0)
            + (1 if scenario.serving else 0)
            + (1 if reports else 0)
        )

    @property
    def artefacts(self) -> list[str]:
        """The names of the files the run has written, in order."""
        return self.ctx.artefacts

    def path_of(self, text: str) -> Path:
        """A path named in the scenario, relative to the scenario file."""
        return self.ctx.path_of(text)

    def resolve(self) -> Resolved:
        """Load and check everything the scenario names; :class:`ScenarioError` names the field at fault."""
        return resolve(self.ctx)

    def _step(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text, self._done, self._total)
        self._done += 1

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
        try:
            with staged_folder(self.out) as partial:
                self.ctx.out = partial
                summary = self._pipeline(resolved, t0)
        finally:
            self.ctx.out = self.out
        if self.progress is not None:
            self.progress("done", self._total, self._total)
        return summary

    def _pipeline(self, resolved: Resolved, t0: float) -> ScenarioSummary:
        ctx, s = self.ctx, self.scenario
        runs: list[PhaseRun] = []
        for i, p in enumerate(s.phases):
            self._step(f"loading {p.label}" if p.label in resolved.graphs else f"capturing {p.label}")
            graph = phase_graph(ctx, i, p, resolved)
            save_graph(graph, ctx.write(f"{p.label}.graph.json.gz"))
            counts = _counts_text(s.simulation.engine_counts)
            self._step(f"simulating {p.label} on {resolved.hardware.name}, engines {counts}")
            run = simulate_phase(ctx, p, graph, resolved)
            check_coverage(ctx, run, resolved.expectations[p.label], s.expectations(p).operators == "auto")
            compare_phase(ctx, i, run)
            runs.append(run)
        if s.replay is not None:
            self._step(f"replaying unique ops on {s.replay.device}")
        replay = replay_ops(ctx, runs)
        checks = [c for run in runs for c in check_phase(s, run)]
        checks += check_replay(s, replay)
        serving = None
        if s.serving is not None:
            from opgraph.scenario.serving import check_serving, run_serving_section

            self._step(f"serving {s.serving.scheduler} batching on {resolved.hardware.name}")
            served = run_serving_section(ctx, resolved)
            serving = served.summary
            checks += check_serving(s.serving, served)
        if self.reports:
            self._step("writing the trace and the report")
        summary = ScenarioSummary(
            name=scenario_name(s, self.path),
            file=self.file,
            description=s.description,
            hardware=resolved.hardware.name,
            cost_model=(
                runs[0].results[runs[0].recommended].cost_model_name if runs else (s.hardware.cost_model or "default")
            ),
            policy=s.simulation.policy,
            host=s.simulation.host_mode,
            tp=s.simulation.tp,
            phases=tuple(phase_result(ctx, r) for r in runs),
            replay=replay,
            serving=serving,
            expectations=tuple(checks),
            passed=all(c.passed for c in checks),
            artefacts=(),
        )
        if self.reports:
            write_reports(ctx, runs, summary)
        ctx.write(SUMMARY_FILE)
        summary = summary.model_copy(update={"artefacts": tuple(ctx.artefacts), "elapsed_s": time.perf_counter() - t0})
        save_model(summary, ctx.out / SUMMARY_FILE)
        return summary


def _counts_text(counts: tuple[int, ...]) -> str:
    if len(counts) > 2 and counts == tuple(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}..{counts[-1]}"
    return ", ".join(map(str, counts))


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
