"""``opgraph run SCENARIO.toml -o OUT``: run a declarative scenario and check its expectations."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from opgraph.cli.common import check_output_path, command, console, err_console, new_table
from opgraph.fmt import fmt_us

if TYPE_CHECKING:
    from opgraph.scenario import ScenarioSummary


@command("run")
def run(
    scenario_path: Path = typer.Argument(..., metavar="SCENARIO", help="A scenario file (.scenario.toml)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output folder for every artefact (default: out/<scenario name>)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of tables."),
    no_report: bool = typer.Option(False, "--no-report", help="Skip the Perfetto trace and the HTML report."),
) -> None:
    """Run a scenario: capture, simulate, replay, compare, and check every expectation.

    Writes the graphs, simulated timelines, a Perfetto trace, an HTML report and summary.json into
    one folder. Paths in the scenario are relative to its file. Exit status: 0 when every
    expectation holds, 1 when one fails (listed), 2 on bad input (one line naming the file and field).
    """
    from opgraph.scenario import ScenarioRun, load_scenario, scenario_name

    check_output_path(output, "-o/--output", inputs=[scenario_path], folder=True)
    scenario = load_scenario(scenario_path)
    out = output if output is not None else Path("out") / scenario_name(scenario, scenario_path)
    check_output_path(out, "-o/--output", inputs=[scenario_path], folder=True)
    runner = ScenarioRun(scenario, out, path=scenario_path, reports=not no_report)
    with _progress() as tick:
        runner.progress = tick
        summary = runner.run()
    if as_json:
        typer.echo(json.dumps(summary.model_dump(mode="json"), indent=2))
    else:
        _print_summary(summary, out)
    if not summary.passed:
        failed = summary.failures
        err = err_console()
        err.print(f"[bold red]{len(failed)} of {len(summary.expectations)} expectation(s) failed:[/bold red]")
        for e in failed:
            err.print(f"  - {e.phase} {e.check}: {e.message}", markup=False)
        raise typer.Exit(1)


class _NoProgress:
    def __enter__(self) -> Any:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Progress:
    """A transient rich progress bar on stderr, one step per pipeline stage."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err_console(),
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=1)

    def __enter__(self) -> Any:
        self.bar.start()

        def tick(text: str, done: int, total: int) -> None:
            self.bar.update(self.task, description=text, completed=done, total=total)

        return tick

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _progress() -> _NoProgress | _Progress:
    return _Progress() if sys.stderr.isatty() else _NoProgress()


def _print_summary(summary: ScenarioSummary, out: Path) -> None:
    console.print(
        f"[bold]{summary.name}[/bold]  {summary.hardware}  cost model {summary.cost_model}  policy "
        f"{summary.policy}  host {summary.host}" + (f"  tp {summary.tp}" if summary.tp > 1 else "")
    )
    if summary.description:
        console.print(summary.description, markup=False)
    for p in summary.phases:
        name = f"{p.name} ({p.phase})" if p.name != p.phase else p.name
        console.print(
            f"{name}: {p.model}, {p.ops} ops, critical path {fmt_us(p.critical_path_us)}"
            + (f", collectives {fmt_us(p.collective_us)}" if p.collective_us else ""),
            markup=False,
        )
    sweep = new_table(title=None)
    for col in ("phase", "engines", "makespan", "speedup", "utilisation"):
        sweep.add_column(col, justify="left" if col == "phase" else "right")
    for p in summary.phases:
        for r in p.sweep:
            best = " *" if r.engines == p.recommended_engines and len(p.sweep) > 1 else ""
            sweep.add_row(
                p.name, f"{r.engines}{best}", fmt_us(r.makespan_us), f"{r.speedup:.2f}x", f"{r.utilization * 100:.0f}%"
            )
    console.print(sweep)
    if any(len(p.sweep) > 1 for p in summary.phases):
        console.print("* recommended: the smallest engine count within the tolerance of the best makespan")
    for p in summary.phases:
        if p.comparison is not None:
            c = p.comparison
            med = "n/a" if c.median_op_error is None else f"{c.median_op_error * 100:.1f}%"
            console.print(
                f"{p.name} vs measured ({c.engines} engine(s), join {c.join}, {c.matched} ops): gpu time "
                f"{c.gpu_time_error * 100:+.1f}%, wall time {c.wall_time_error * 100:+.1f}%, median |op error| {med}",
                markup=False,
            )
    if summary.replay is not None:
        rp = summary.replay
        statuses = ", ".join(f"{k} {v}" for k, v in rp.statuses.items())
        console.print(
            f"replay on {rp.device} ({rp.device_name}): {rp.configs} of {rp.total_configs} configs; {statuses}"
        )
    if summary.expectations:
        table = new_table(title="expectations", title_justify="left")
        table.add_column("result")
        table.add_column("expectation")
        table.add_column("detail")
        for e in summary.expectations:
            mark = "[green]pass[/green]" if e.passed else "[bold red]FAIL[/bold red]"
            table.add_row(mark, e.id, e.message)
        console.print(table)
    else:
        console.print("no expectations declared")
    shown = [a for a in summary.artefacts if not a.endswith(".timeline.json.gz")]
    n_tl = len(summary.artefacts) - len(shown)
    console.print(
        f"wrote {len(summary.artefacts)} files to {out}/: {', '.join(shown)}"
        + (f" and {n_tl} timelines" if n_tl else "")
    )
    verdict = "[bold green]PASSED[/bold green]" if summary.passed else "[bold red]FAILED[/bold red]"
    console.print(f"{verdict} in {summary.elapsed_s:.1f} s")
