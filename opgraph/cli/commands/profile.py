"""``opgraph profile --device cuda -o h100.profile.json``: measure a device profile for the ``profile`` cost model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import KindsOption, command, console, err_console, fmt_us, parse_kinds, print_notes

if TYPE_CHECKING:
    from hardware import DeviceProfile
    from validators.profile import SweepPoint
    from validators.results import ReplayResult


@command("profile")
def profile(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="The profile JSON to write (points stream to OUT.parts.jsonl); not with --plan."
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="cuda, cuda:N, or cpu (a tiny sweep, for tests)."),
    budget_s: float | None = typer.Option(
        None, "--budget-s", help="Stop before the next point would pass this many seconds; the profile stays valid."
    ),
    resume: bool = typer.Option(False, "--resume", help="Keep OUT.parts.jsonl and skip the points it holds."),
    hardware: str = typer.Option(
        "", "--hardware", "-H", help="Catalog name the profile predicts for (default: guessed from the GPU's name)."
    ),
    sessions: int = typer.Option(3, "--sessions", help="Fewest profiler sessions per point (kernels timer)."),
    max_sessions: int = typer.Option(5, "--max-sessions", help="Most profiler sessions per point."),
    passes: int | None = typer.Option(
        None,
        "--passes",
        help="Passes over the compute-bound points, whose time moves with the GPU's power state; each keeps"
        " the median (default: 3 on a GPU, 1 on the CPU).",
    ),
    kinds: KindsOption = "",
    max_points: int | None = typer.Option(None, "--max-points", help="Only the first N points of the sweep."),
    plan: bool = typer.Option(False, "--plan", help="Print the sweep's points and exit without measuring."),
    from_parts: bool = typer.Option(
        False, "--from-parts", help="Measure nothing: rewrite OUT from OUT.parts.jsonl (after a killed sweep)."
    ),
    pool: list[Path] | None = typer.Option(
        None,
        "--pool",
        help="Measure nothing: pool these profiles of one device (sweeps on other machines or hours) into OUT,"
        " each point's time the median of all measured; repeat the option. Host times are the first's.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary, no line per point."),
) -> None:
    """Measure a device profile: synthetic ops of every kind, in the regimes models reach.

    GEMMs (m from 1 to 16k over the shapes of Llama, Qwen2.5, Qwen3-MoE, Mixtral; bf16, some fp16
    and fp32), attention decode and prefill, norms, RoPE, activations, elementwise, softmax,
    copies, KV-cache writes, embeddings, MoE routing and expert GEMMs, the launch floor and the
    host time per aten call; each replayed with the replay recipes and timer (cold L2, as a
    model runs). Points stream to OUT.parts.jsonl, most informative first; `--resume` carries on.

    Predict from it with `opgraph simulate -H HW -c OUT`. `--pool A --pool B -o OUT` pools sweeps of one
    device (each point's time the median of every pass of every sweep).
    """
    from hardware import load_hardware
    from opgraph.ir import OpgraphError
    from validators.profile import (
        REPEAT_PASSES,
        pool_profiles,
        profile_from_parts,
        run_profile,
        sweep_points,
        sweep_timing,
    )

    wanted = parse_kinds(kinds)
    if budget_s is not None and budget_s <= 0:
        raise OpgraphError(f"{budget_s:g} is not a positive number of seconds", where="--budget-s")
    if max_points is not None and max_points < 1:
        raise OpgraphError(f"{max_points} is out of range", where="--max-points", hint="give 1 or more")
    if sessions < 1 or max_sessions < 1:
        raise OpgraphError("session counts must be 1 or more", where="--sessions/--max-sessions")
    if passes is not None and passes < 1:
        raise OpgraphError(f"{passes} passes is out of range", where="--passes", hint="give 1 or more")
    if out is None and not plan:
        raise OpgraphError("missing the profile to write", where="-o/--out", hint="e.g. -o h100.profile.json")
    if pool and (plan or resume or from_parts):
        raise OpgraphError(
            "--pool measures nothing", where="--pool", hint="give it without --plan, --resume or --from-parts"
        )
    if pool and out is not None:
        from hardware import load_profile

        pooled = pool_profiles([load_profile(p) for p in pool])
        pooled.save(out)
        _summary(out, pooled)
        return
    hw_name = load_hardware(hardware).name if hardware else ""
    device_type = "cuda" if device.startswith("cuda") else device
    points = sweep_points(device_type, kinds=wanted)
    if max_points is not None:
        points = points[:max_points]
    if plan:
        _print_plan(points)
        if device_type == "cuda" and (passes is None or passes > 1):
            console.print(
                f"then {(passes or REPEAT_PASSES) - 1} more pass(es) over the points measured compute-bound"
                " (50 us or more), each keeping the median of its passes",
                markup=False,
                highlight=False,
            )
        return
    if out is None:  # --plan returned above
        raise OpgraphError("missing the profile to write", where="-o/--out", hint="e.g. -o h100.profile.json")
    if out.exists() and out.is_dir():
        raise OpgraphError(
            "is a directory", where=str(out), hint="give the profile's file name, e.g. h100.profile.json"
        )

    def on_point(i: int, n: int, sp: SweepPoint, r: ReplayResult | None) -> None:
        if quiet:
            return
        again = " (again)" if i > len(points) else ""
        if r is None:
            console.print(f"[{i}/{n}] done earlier  {sp.op.definition}{again}")
            return
        t = r.timing
        took = f"{fmt_us(t.median_us)}" if t is not None else r.reason[:120]
        console.print(f"[{i}/{n}] {r.status.value:<11} {sp.series:<28} {sp.op.definition}{again}  {took}")

    timing = sweep_timing(device_type, sessions=sessions, max_sessions=max_sessions)
    if from_parts:
        prof = profile_from_parts(out, points, timing, hardware=hw_name)
        _summary(out, prof)
        return
    started = time.monotonic()
    try:
        prof = run_profile(
            out, device, points=points, budget_s=budget_s, resume=resume, hardware=hw_name,
            timing=timing, passes=passes, on_point=on_point,
        )  # fmt: skip
    except KeyboardInterrupt:
        err_console().print(f"interrupted: points measured so far are in {out}.parts.jsonl; rerun with --resume")
        raise
    _summary(out, prof, seconds=time.monotonic() - started)


def plan_sizes(points: list[SweepPoint]) -> list[str]:
    """Each point's size coordinate: the shape fields that vary along its series (``m=16``,
    ``q_len=128 kv_len=128``), empty for a series of one point."""
    from hardware.models.table import shape_key

    shapes = [shape_key(p.op) for p in points]
    by_series: dict[str, list[dict[str, int]]] = {}
    for p, shape in zip(points, shapes, strict=True):
        by_series.setdefault(p.series, []).append(shape)
    varying: dict[str, list[str]] = {}
    for series, members in by_series.items():
        shared = [n for n in members[0] if all(n in m for m in members)]
        varying[series] = [n for n in shared if len({m[n] for m in members}) > 1]
    return [" ".join(f"{n}={shape[n]}" for n in varying[p.series]) for p, shape in zip(points, shapes, strict=True)]


def _print_plan(points: list[SweepPoint]) -> None:
    """``profile --plan``: one line per point (level, series, definition, size, tag; a ``writeback`` point's
    dirty MiB) as plain text."""
    from hardware.models.profile import WRITEBACK_TAG

    sizes = plan_sizes(points)
    width = max((len(p.op.definition) for p in points), default=0)
    for i, (p, size) in enumerate(zip(points, sizes, strict=True), 1):
        tag = f"[{p.tag}" + (f", {p.dirty_bytes >> 20} MiB dirty" if p.tag == WRITEBACK_TAG else "") + "]"
        extra = " ".join(x for x in (size, tag if p.tag else "") if x)
        line = f"{i:>4} L{p.level} {p.series:<28} {p.op.definition:<{width}} {extra}".rstrip()
        console.print(line, markup=False, highlight=False)
    console.print(f"{len(points)} points")


def _summary(out: Path, prof: DeviceProfile, seconds: float | None = None) -> None:
    """The profile's one-line summary; ``seconds``, when given, is how long this run measured."""
    state = "complete" if prof.complete else "incomplete"
    console.print(
        f"profile: {out} ({len(prof.points)} points of {prof.planned} planned, {state}) on "
        f"{prof.device.name} for {prof.device.hardware or 'no catalog device'}"
        + (f"; launch {prof.launch_us:.3g} us" if prof.launch_us is not None else "")
        + (f", {prof.aten_issue_us:.3g} us host per aten call" if prof.aten_issue_us is not None else "")
        + (f"; this run took {seconds:.0f} s" if seconds is not None else "")
    )
    print_notes(prof.notes)
