"""``opgraph profile --device cuda -o h100.profile.json``: measure a device profile for the ``profile`` cost model."""

from __future__ import annotations

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
    out: Path = typer.Option(..., "--out", "-o", help="The profile JSON to write (points stream to OUT.parts.jsonl)."),
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
    kinds: KindsOption = "",
    max_points: int | None = typer.Option(None, "--max-points", help="Only the first N points of the sweep."),
    plan: bool = typer.Option(False, "--plan", help="Print the sweep's points and exit without measuring."),
    from_parts: bool = typer.Option(
        False, "--from-parts", help="Measure nothing: rewrite OUT from OUT.parts.jsonl (after a killed sweep)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary, no line per point."),
) -> None:
    """Measure a device profile: synthetic ops of every kind, in the regimes models reach.

    GEMMs (m from 1 to 16k over the shapes of Llama, Qwen2.5, Qwen3-MoE, Mixtral; bf16, some fp16
    and fp32), attention decode and prefill, norms, RoPE, activations, elementwise, softmax,
    copies, KV-cache writes, embeddings, MoE routing and expert GEMMs, the launch floor and the
    host time per aten call; each replayed with the replay recipes and timer (cold L2, as a
    model runs). Points stream to OUT.parts.jsonl, most informative first; `--resume` carries on.

    Predict from it with `opgraph simulate -H HW -c OUT`.
    """
    from hardware import load_hardware
    from opgraph.ir import OpgraphError
    from validators.profile import profile_from_parts, run_profile, sweep_points, sweep_timing

    wanted = parse_kinds(kinds)
    if budget_s is not None and budget_s <= 0:
        raise OpgraphError(f"{budget_s:g} is not a positive number of seconds", where="--budget-s")
    if max_points is not None and max_points < 1:
        raise OpgraphError(f"{max_points} is out of range", where="--max-points", hint="give 1 or more")
    if sessions < 1 or max_sessions < 1:
        raise OpgraphError("session counts must be 1 or more", where="--sessions/--max-sessions")
    if out.exists() and out.is_dir():
        raise OpgraphError(
            "is a directory", where=str(out), hint="give the profile's file name, e.g. h100.profile.json"
        )
    hw_name = load_hardware(hardware).name if hardware else ""
    device_type = "cuda" if device.startswith("cuda") else device
    points = sweep_points(device_type, kinds=wanted)
    if max_points is not None:
        points = points[:max_points]
    if plan:
        for i, p in enumerate(points, 1):
            tag = f" [{p.tag}]" if p.tag else ""
            console.print(f"{i:>4} L{p.level} {p.series:<28} {p.op.definition}{tag}")
        console.print(f"{len(points)} points")
        return

    def on_point(i: int, n: int, sp: SweepPoint, r: ReplayResult | None) -> None:
        if quiet:
            return
        if r is None:
            console.print(f"[{i}/{n}] done earlier  {sp.op.definition}")
            return
        t = r.timing
        took = f"{fmt_us(t.median_us)}" if t is not None else r.reason[:120]
        console.print(f"[{i}/{n}] {r.status.value:<11} {sp.series:<28} {sp.op.definition}  {took}")

    timing = sweep_timing(device_type, sessions=sessions, max_sessions=max_sessions)
    if from_parts:
        prof = profile_from_parts(out, points, timing, hardware=hw_name)
        _summary(out, prof)
        return
    try:
        prof = run_profile(
            out, device, points=points, budget_s=budget_s, resume=resume, hardware=hw_name,
            timing=timing, on_point=on_point,
        )  # fmt: skip
    except KeyboardInterrupt:
        err_console().print(f"interrupted: points measured so far are in {out}.parts.jsonl; rerun with --resume")
        raise
    _summary(out, prof)


def _summary(out: Path, prof: DeviceProfile) -> None:
    state = "complete" if prof.complete else "incomplete"
    console.print(
        f"profile: {out} ({len(prof.points)} points of {prof.planned} planned, {state}) on "
        f"{prof.device.name} for {prof.device.hardware or 'no catalog device'}"
        + (f"; launch {prof.launch_us:.3g} us" if prof.launch_us is not None else "")
        + (f", {prof.aten_issue_us:.3g} us host per aten call" if prof.aten_issue_us is not None else "")
    )
    print_notes(prof.notes)
