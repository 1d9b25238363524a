"""The report step of a run: the Perfetto trace and the HTML report of every phase, sweep and check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opgraph.fmt import fmt_us_sig
from opgraph.ir import Timeline
from opgraph.scenario.context import RunContext
from opgraph.scenario.phases import PhaseRun
from opgraph.scenario.result import ScenarioSummary

if TYPE_CHECKING:
    from simulators import SimulationResult

REPORT_FILE = "report.html"
"""The HTML report in the output folder."""
TRACE_FILE = "trace.perfetto.json.gz"
"""The Perfetto trace in the output folder."""

MAX_REPORT_TIMELINES = 8
"""Above this many simulated timelines, the report and trace keep only each phase's recommended count."""


def write_reports(ctx: RunContext, runs: Sequence[PhaseRun], summary: ScenarioSummary) -> None:
    """Write the Perfetto trace (every simulated and measured timeline) and the HTML report."""
    from opgraph.export import ReportTable, write_html_report, write_perfetto

    total = sum(len(r.timelines) for r in runs)
    timelines: list[Timeline] = []
    for r in runs:
        keep = r.timelines if total <= MAX_REPORT_TIMELINES else {r.recommended: r.timelines[r.recommended]}
        timelines.extend(keep[n] for n in sorted(keep))
    single = len(runs) == 1
    graph = runs[0].graph if single else None
    measured = [r.measured for r in runs if r.measured is not None]
    tp = ctx.scenario.simulation.tp
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
    write_perfetto([*trace_tls, *measured], ctx.write(TRACE_FILE), graph=graph)

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
    write_html_report(ctx.write(REPORT_FILE), timelines=timelines, graph=graph, tables=tables, title=title)


def _renamed_ranks(res: SimulationResult, name: str) -> list[Timeline]:
    out = []
    for r, tl in enumerate(res.rank_timelines()):
        out.append(tl.model_copy(update={"source": tl.source.model_copy(update={"name": f"{name} rank{r}"})}))
    return out


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


def _sweep_table(run: PhaseRun) -> Any:
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
        f"critical path {fmt_us_sig(run.critical_path_us)}",
        numeric=(True, True, True, True, True),
    )
