"""``opgraph calibrate REPLAY.jsonl... --hardware h100 -o calibrated.json``: fit a cost table."""

from __future__ import annotations

from pathlib import Path

import typer

from opgraph.cli.common import check_output_path, console, handle_errors, new_table


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the app."""
    app.command("calibrate")(calibrate)


@handle_errors
def calibrate(
    replays: list[Path] = typer.Argument(..., metavar="REPLAY.jsonl...", help="Replay results (`opgraph replay`)."),
    hardware_name: str = typer.Option(..., "--hardware", "-H", help="The device replayed on: catalog name or file."),
    output: Path = typer.Option(..., "--output", "-o", help="Calibrated hardware + cost table file (.json[.gz])."),
    trace: Path | None = typer.Option(
        None, "--trace", help="Fit the eager host overhead per op from this measured trace's kernel launches instead."
    ),
    issue: Path | None = typer.Option(
        None,
        "--issue",
        help="Host issue times from `opgraph replay --issue-only` (timed right before the run to predict) "
        "instead of the replay results'.",
    ),
    include_mismatch: bool = typer.Option(
        True, "--include-mismatch/--ok-only", help="Use timings of configs whose numeric check failed."
    ),
) -> None:
    """Fit the table cost model (measured times, per-kind efficiency, launch and host overheads) from replays.

    The output is one file that `opgraph simulate` takes as both `--hardware` and `--cost-model`.
    """
    from hardware import Measurement, fit_cost_table, host_overhead_from_trace, load_hardware
    from opgraph.ir import OpgraphError
    from validators import ReplayStatus, load_results

    check_output_path(output, "-o/--output", inputs=[*replays, trace, issue])
    issue_us: dict[str, float] = {}
    if issue is not None:
        from validators import load_issue

        issue_us = load_issue(issue).us_by_key
    usable = {ReplayStatus.OK, ReplayStatus.MISMATCH} if include_mismatch else {ReplayStatus.OK}
    from_issue = 0
    measurements: list[Measurement] = []
    devices: set[str] = set()
    total = 0
    for path in replays:
        for r in load_results(path):
            total += 1
            if r.status not in usable or r.timing is None:
                continue
            devices.add(r.device_name or r.device)
            t = r.timing
            host_us = issue_us.get(r.key, t.host_us)
            from_issue += r.key in issue_us
            measurements.append(
                Measurement(
                    op=r.op,
                    seconds=t.median_us * 1e-6,
                    host_seconds=host_us * 1e-6 if host_us is not None else None,
                    spread_s=t.iqr_us * 1e-6,
                    samples=t.samples,
                )
            )
    if not measurements:
        raise OpgraphError(
            f"none of the {total} results has a usable timing",
            where=", ".join(map(str, replays)),
            hint="replay on the device first; results with status error/unsupported carry no time",
        )
    if issue is not None and not from_issue:
        raise OpgraphError(
            f"none of its {len(issue_us)} configs is among the {len(measurements)} timed replay results",
            where=str(issue),
            hint="time the issue of the same graphs (`opgraph replay GRAPH --issue-only`)",
        )
    hw = load_hardware(hardware_name)
    host_us = None
    if trace is not None:
        from opgraph.compare.loading import load_any_timeline

        host_us = host_overhead_from_trace(load_any_timeline(trace))
    table = fit_cost_table(
        measurements,
        hw,
        source={"replays": ", ".join(p.name for p in replays), "devices": ", ".join(sorted(devices))},
        host_overhead_us=host_us,
    )
    table.save(output)
    if issue is not None:
        console.print(f"issue times: {from_issue} of {len(measurements)} configs from {issue}")
    shown = new_table(title=f"Calibrated {hw.name} from {len(measurements)} measured configs", title_justify="left")
    shown.add_column("fit")
    for note in table.notes:
        shown.add_row(note)
    console.print(shown)
    if len(devices) > 1:
        console.print(f"warning: results come from several devices: {', '.join(sorted(devices))}")
    console.print(f"wrote {output}: use it as `opgraph simulate GRAPH --hardware {output} --cost-model {output}`")
