"""``opgraph calibrate REPLAY.jsonl... --hardware h100 -o calibrated.json``: fit a cost table."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import check_output_path, command, console, new_table

if TYPE_CHECKING:
    from hardware import HardwareSpec, Measurement
    from validators.results import ReplayResult


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
    keep_unconverged: bool = typer.Option(
        False,
        "--keep-unconverged",
        help="Fit unsettled timings too (a median's 95% confidence over ±5%, or samples spread over 25%); "
        "by default they are left out, listed, and the table's notes say so.",
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
    hw = load_hardware(hardware_name)
    issue_us: dict[str, float] = {}
    if issue is not None:
        from validators import load_issue

        issue_us = load_issue(issue).us_by_key
    got = collect_replays(replays, issue_us, include_mismatch, keep_unsettled=keep_unconverged)
    check_replay_devices(got.timed, hw)
    if got.unsettled and not keep_unconverged and not got.measurements:
        raise OpgraphError(
            f"all {len(got.unsettled)} timed results are unsettled ({_unsettled_names(got.unsettled)})",
            where=", ".join(map(str, replays)),
            hint="replay again with more samples (--min-samples, --max-time) on a quiet machine, "
            "or fit them anyway with --keep-unconverged",
        )
    if not got.measurements:
        raise OpgraphError(
            f"none of the {got.total} results has a usable timing",
            where=", ".join(map(str, replays)),
            hint="replay on the device first; results with status error/unsupported carry no time",
        )
    measurements, devices, from_issue = got.measurements, got.devices, got.from_issue
    if issue is not None and not from_issue:
        raise OpgraphError(
            f"none of its {len(issue_us)} configs is among the {len(measurements)} timed replay results",
            where=str(issue),
            hint="time the issue of the same graphs (`opgraph replay GRAPH --issue-only`)",
        )
    for line in got.warnings:
        print(f"warning: {line}", file=sys.stderr)
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
    if got.unsettled:
        table = table.model_copy(update={"notes": (*table.notes, _unsettled_note(got.unsettled, keep_unconverged))})
    table.save(output)
    if issue is not None:
        console.print(f"issue times: {from_issue} of {len(measurements)} configs from {issue}")
    shown = new_table(title=f"Calibrated {hw.name} from {len(measurements)} measured configs", title_justify="left")
    shown.add_column("fit")
    for note in table.notes:
        shown.add_row(note)
    console.print(shown)
    if len(devices) > 1:
        print(f"warning: results come from several devices: {', '.join(sorted(devices))}", file=sys.stderr)
    console.print(f"wrote {output}: use it as `opgraph simulate GRAPH --hardware {output} --cost-model {output}`")


@dataclass
class ReplaySet:
    """What ``calibrate`` read from replay results (:func:`collect_replays`)."""

    measurements: list[Measurement] = field(default_factory=list)
    """What the fit takes: one per timed (and settled, unless kept) config."""
    timed: list[ReplayResult] = field(default_factory=list)
    """Every result with a usable status and a timing, settled or not."""
    unsettled: list[ReplayResult] = field(default_factory=list)
    """Timed results whose median did not settle (:attr:`~validators.results.TimingStats.instability`)."""
    devices: set[str] = field(default_factory=set)
    """The devices the measurements were taken on (model names)."""
    from_issue: int = 0
    """Measurements whose host time came from the issue times."""
    total: int = 0
    """Results read, of any status."""
    warnings: list[str] = field(default_factory=list)
    """One line each: lines skipped in a file, unsettled timings."""


def collect_replays(
    replays: list[Path], issue_us: dict[str, float], include_mismatch: bool = True, *, keep_unsettled: bool = False
) -> ReplaySet:
    """Read replay result files for a fit: a file with no replay result is an error naming what it is,
    skipped lines and unsettled timings are warnings; unsettled timings are left out of the
    measurements unless ``keep_unsettled``.

    Device times are the replay medians; host issue times come from ``issue_us`` (``replay
    --issue-only``, by config key) where it has the config, else from the replay.
    """
    from hardware import Measurement
    from opgraph.ir import OpgraphError
    from validators import ReplayStatus
    from validators.results import describe_file, load_results

    usable = {ReplayStatus.OK, ReplayStatus.MISMATCH} if include_mismatch else {ReplayStatus.OK}
    got = ReplaySet()
    for path in replays:
        skipped: list[int] = []
        results = load_results(path, skipped=skipped)
        if not results:
            raise OpgraphError(
                f"is {describe_file(path)}, not replay results",
                where=str(path),
                hint="give the JSONL results `opgraph replay GRAPH -o replay.jsonl` writes",
            )
        if skipped:
            got.warnings.append(
                f"{path}: skipped {len(skipped)} line(s) that are not replay results (the first is line "
                f"{skipped[0]}); the {len(results)} readable result(s) are used"
            )
        got.total += len(results)
        for r in results:
            if r.status not in usable or r.timing is None:
                continue
            got.timed.append(r)
            t = r.timing
            if t.instability:
                got.unsettled.append(r)
                if not keep_unsettled:
                    continue
            got.devices.add(r.device_name or r.device)
            host_us = issue_us.get(r.key, t.host_us)
            got.from_issue += r.key in issue_us
            got.measurements.append(
                Measurement(
                    op=r.op,
                    seconds=t.median_us * 1e-6,
                    host_seconds=host_us * 1e-6 if host_us is not None else None,
                    spread_s=t.iqr_us * 1e-6,
                    samples=t.samples,
                )
            )
    if got.unsettled:
        what = "kept in the fit (--keep-unconverged)" if keep_unsettled else "left out of the fit"
        got.warnings.append(
            f"{len(got.unsettled)} of {len(got.timed)} timings did not settle, {what}: "
            f"{_unsettled_names(got.unsettled)}" + ("" if keep_unsettled else " (--keep-unconverged fits them)")
        )
    return got


def _unsettled_names(results: list[ReplayResult], shown: int = 4) -> str:
    """``gemm_n64_k64 (median ±16% after 9 samples, spread 31%), ...``: the first few, and how many more."""
    parts = [f"{r.definition} ({r.timing.instability})" for r in results[:shown] if r.timing is not None]
    return "; ".join(parts) + (f"; {len(results) - shown} more" if len(results) > shown else "")


def _unsettled_note(results: list[ReplayResult], kept: bool) -> str:
    """The table's note about unsettled timings (the fit says what it did with them)."""
    names = ", ".join(sorted({r.definition for r in results}))
    if kept:
        return f"{len(results)} unsettled timing(s) fitted as measured (--keep-unconverged): {names}"
    return f"{len(results)} unsettled timing(s) left out, costed as unmeasured shapes: {names}"


def check_replay_devices(results: list[ReplayResult], hw: HardwareSpec) -> None:
    """Refuse results replayed on another device than ``hw``: a table fitted from them would carry
    ``hw``'s name, and ``simulate -H`` would take it for that device (one-line error, the first).

    A CPU replay calibrates a CPU spec only, a GPU replay a GPU spec only; a GPU the catalog knows
    (:func:`~validators.profile.guess_hardware`) must be ``hw`` (its name or one of its aliases); one it
    does not know is taken as it is (nothing tells).
    """
    from hardware.loader import normalize_name
    from hardware.spec import DeviceKind
    from opgraph.ir import OpgraphError
    from validators.profile import guess_hardware

    names = {normalize_name(n) for n in (hw.name, *hw.aliases)}
    replay = "--device cpu" if hw.kind is DeviceKind.CPU else "--device cuda"
    for r in results:
        on_cpu = r.device.split(":")[0] == "cpu"
        ran = f"the CPU ({r.device_name})" if on_cpu and r.device_name else r.device_name or r.device
        guessed = "" if on_cpu else guess_hardware(r.device_name)
        if on_cpu != (hw.kind is DeviceKind.CPU):
            kind = "a CPU" if hw.kind is DeviceKind.CPU else f"a {hw.kind.value.upper()}"
            why = f"the results were replayed on {ran}, not on {hw.name}, {kind}"
        elif guessed and normalize_name(guessed) not in names:
            why = f"the results were replayed on {ran} ({guessed}), not on {hw.name}"
        else:
            continue
        theirs = "-H cpu or a CPU spec file" if on_cpu else f"-H {guessed}" if guessed else "-H for their GPU"
        raise OpgraphError(
            why,
            where="--hardware",
            hint=f"give {theirs}, or replay on {hw.name} (`opgraph replay GRAPH {replay}`)",
        )


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
