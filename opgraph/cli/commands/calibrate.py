"""``opgraph calibrate REPLAY.jsonl... --hardware h100 -o calibrated.json``: fit a cost table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import check_output_path, command, console, new_table

if TYPE_CHECKING:
    from hardware import Measurement


@command("calibrate")
def calibrate(
    replays: list[Path] = typer.Argument(
        ...,
        metavar="REPLAY.jsonl...",
        help="Replay results (`opgraph replay`); with --collectives, collective measurements "
        "(`opgraph replay --collectives`).",
    ),
    hardware_name: str | None = typer.Option(
        None,
        "--hardware",
        "-H",
        help="The device replayed on: catalog name or file (with --collectives: optional, link efficiencies "
        "relative to its interconnect).",
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Calibrated hardware + cost table file (.json[.gz]); with --collectives the fit."
    ),
    collectives: bool = typer.Option(
        False,
        "--collectives",
        help="Fit collectives (alpha, bus bandwidth, piecewise per collective and group size) from "
        "`opgraph replay --collectives` measurements; `simulate --tp N --collective-fit` takes the output.",
    ),
    max_spread: float = typer.Option(
        0.1, "--max-spread", help="--collectives: leave out sizes whose calls spread more (IQR / median) than this."
    ),
    heldout: bool = typer.Option(
        False, "--heldout", help="--collectives: also fit the even-indexed sizes and score the odd-indexed ones."
    ),
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
    With `--collectives`: fit the measured collectives instead; `opgraph simulate --tp N
    --collective-fit OUTPUT` costs collectives from it.
    """
    from hardware import fit_cost_table, host_overhead_from_trace, load_hardware
    from opgraph.ir import OpgraphError

    check_output_path(output, "-o/--output", inputs=[*replays, trace, issue])
    if collectives:
        for flag, value in (("--trace", trace), ("--issue", issue)):
            if value is not None:
                raise OpgraphError(
                    "is for op replay results, not collectives", where=flag, hint="leave it out with --collectives"
                )
        _calibrate_collectives(replays, hardware_name, output, max_spread, heldout)
        return
    if max_spread != 0.1 or heldout:
        raise OpgraphError(
            "only applies to collectives", where="--heldout" if heldout else "--max-spread", hint="add --collectives"
        )
    if hardware_name is None:
        raise OpgraphError("missing the device replayed on", where="--hardware", hint="e.g. -H h100")
    issue_us: dict[str, float] = {}
    if issue is not None:
        from validators import load_issue

        issue_us = load_issue(issue).us_by_key
    measurements, devices, from_issue, total = replay_measurements(replays, issue_us, include_mismatch)
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


def replay_measurements(
    replays: list[Path], issue_us: dict[str, float], include_mismatch: bool = True
) -> tuple[list[Measurement], set[str], int, int]:
    """What `calibrate` fits from replay results: ``(measurements, devices, configs timed by issue_us, results)``.

    Device times are the replay medians; host issue times come from ``issue_us`` (``replay
    --issue-only``, by config key) where it has the config, else from the replay.
    """
    from hardware import Measurement
    from validators import ReplayStatus, load_results

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
    return measurements, devices, from_issue, total


def _calibrate_collectives(
    files: list[Path], hardware_name: str | None, output: Path, max_spread: float, heldout: bool
) -> None:
    """``calibrate --collectives``: fit the measured collectives, print the fits (and held-out errors)."""
    import statistics

    from hardware import fit_collectives, heldout_errors, load_collective_samples, load_hardware
    from hardware.collective_fit import format_calibration
    from opgraph.ir import OpgraphError

    if not max_spread > 0:
        raise OpgraphError(f"{max_spread} is not a positive fraction", where="--max-spread", hint="e.g. 0.1")
    samples = [s for path in files for s in load_collective_samples(path)]
    if not samples:
        raise OpgraphError(
            "no collective measurement in the file(s)",
            where=", ".join(map(str, files)),
            hint="measure them with `torchrun --nproc-per-node N -m opgraph replay --collectives`",
        )
    hw = load_hardware(hardware_name) if hardware_name else None
    cal = fit_collectives(samples, hardware=hw, strict=False, max_spread=max_spread)
    held = heldout_errors(samples, max_spread=max_spread) if heldout else []
    cal.save(output)
    console.print(format_calibration(cal), markup=False)
    for line in cal.skipped:
        console.print(f"skipped: {line}", markup=False)
    if heldout:
        if held:
            errs = sorted(h.rel_err for h in held)
            console.print(
                f"held out (fit on even-indexed sizes, {len(errs)} clean odd-indexed sizes scored): "
                f"median {statistics.median(errs):.1%}, max {errs[-1]:.1%}"
            )
        else:
            console.print("held out: no clean odd-indexed size could be scored")
    where = f" on {cal.device_name}" if cal.device_name else ""
    console.print(
        f"wrote {output}: {len(cal.fits)} fits from {len(samples)} measurements{where}; use it as "
        f"`opgraph simulate GRAPH --tp N --collective-fit {output}`"
    )
