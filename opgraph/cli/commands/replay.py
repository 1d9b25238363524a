"""``opgraph replay GRAPH... --device cuda -o replay.jsonl``: run every unique op, check it, time it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from opgraph.cli.common import KindsOption, check_output_path, command, console, err_console, parse_kinds
from opgraph.fmt import fmt_us

if TYPE_CHECKING:
    from validators.collectives import CollectiveMeasurement
    from validators.configs import Estimator
    from validators.results import ReplayResult
    from validators.timing import CudaTimerKind


def _parse_recipes(items: list[str]) -> dict[str, str]:
    from opgraph.ir import OpgraphError

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise OpgraphError(
                f"{item!r} is not TARGET=RECIPE",
                where="--recipe",
                hint="e.g. --recipe aten.mm.default=pkg.mod:MyRecipe",
            )
        out[key] = value
    return out


def _status_style(status: str) -> str:
    return {"ok": "green", "mismatch": "yellow", "unsupported": "magenta", "skipped": "dim", "oom": "red"}.get(
        status, "red"
    )


def _line(r: ReplayResult, i: int, n: int) -> str:
    width = len(str(n))
    status = f"[{_status_style(r.status.value)}]{r.status.value:<11}[/]"
    share = f" {100 * r.share:5.1f}%" if r.share is not None else ""
    head = f"[{i:>{width}}/{n}] {status}{share} x{r.count:<4} {r.definition}"
    if r.timing is not None:
        t = r.timing
        head += f"  {fmt_us(t.median_us)} iqr {100 * t.spread:.1f}%"
        if t.instability:
            head += f"  [yellow]unsettled: {t.instability}[/]"
        if r.energy is not None:
            head += f"  {r.energy.joules_per_call * 1e3:.3g} mJ"
    if r.reason and r.status.value != "ok":
        head += f"  [dim]{r.reason[:140]}[/dim]"
    return head


@command("replay")
def replay(
    graphs: list[Path] = typer.Argument(
        None,
        metavar="GRAPH...",
        help="Graphs saved by `opgraph capture` (.json, .json.gz); with --collectives: optional, replay "
        "their collectives (sharded graphs, or --tp N) instead of a sweep.",
    ),
    out: Path = typer.Option(
        Path("replay.jsonl"), "--out", "-o", help="JSONL results, one record per config, streamed."
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="cpu, cuda or cuda:N (under torchrun: each rank's GPU)."),
    resume: bool = typer.Option(False, "--resume", help="Keep OUT and skip configs it already holds."),
    check: bool = typer.Option(True, "--check/--no-check", help="Compare each op with a float64 reference."),
    reference_device: str = typer.Option("cpu", "--reference-device", help="Where the float64 reference runs."),
    check_max_flops: float = typer.Option(
        5e12, "--check-max-flops", help="Ops above this many FLOPs get their float64 reference on the replay device."
    ),
    energy: bool | None = typer.Option(
        None, "--energy/--no-energy", help="Board energy per call via NVML (default: when available)."
    ),
    energy_window: float = typer.Option(
        0.3, "--energy-window", help="Seconds of back-to-back calls per config for energy."
    ),
    cold_l2: bool = typer.Option(
        True,
        "--cold-l2/--warm-l2",
        help="Flush the L2 cache before each timed call (the default, as a model run leaves weights and the "
        "KV cache in DRAM, and as `opgraph profile` and `opgraph validate` time ops); --warm-l2 times back-to-back "
        "calls with the L2 hot.",
    ),
    warm_activations: bool = typer.Option(
        True,
        "--warm-activations/--cold-activations",
        help="With --cold-l2: read the op's activation inputs back into L2 after the flush, as the model "
        "leaves them (only weights and the KV cache stay cold).",
    ),
    issue_in_sequence: bool = typer.Option(
        True,
        "--issue-in-sequence/--issue-in-burst",
        help="CUDA host issue time: every op of the graphs called in their order, as a model issues them "
        "(default), or calls of each op alone (hot CPU caches, a lower bound).",
    ),
    issue_only: bool = typer.Option(
        False,
        "--issue-only",
        help="Only time each op's host issue in the graphs' order (CUDA, seconds) and write OUT as JSON for "
        "`calibrate --issue`: right before the run to predict, since a shared host's speed drifts.",
    ),
    timer: str = typer.Option(
        "kernels", "--timer", help="CUDA timer: kernels (sum of kernel durations, as traces count) or events."
    ),
    warmup_ms: float = typer.Option(25.0, "--warmup-ms", help="Untimed warm-up per config, milliseconds."),
    min_samples: int = typer.Option(10, "--min-samples", help="Fewest timed samples per config."),
    max_samples: int = typer.Option(300, "--max-samples", help="Most timed samples per config."),
    max_time: float = typer.Option(
        1.0, "--max-time", help="Most seconds of sampling per config (CPU and events timers)."
    ),
    sessions: int = typer.Option(9, "--sessions", help="Fewest profiler sessions per config (kernels timer)."),
    max_sessions: int = typer.Option(
        25, "--max-sessions", help="Most profiler sessions per config: added until the median is within --target-ci."
    ),
    target_ci: float = typer.Option(
        0.005, "--target-ci", help="Stop when the median's 95% confidence half-width is below this fraction."
    ),
    kinds: KindsOption = "",
    limit: int | None = typer.Option(None, "--limit", help="Only the N most expensive configs."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic inputs."),
    moe_skew: float | None = typer.Option(
        None, "--moe-skew", help="MoE routing skew (default: the graph's assumption)."
    ),
    recipe: list[str] = typer.Option([], "--recipe", help="TARGET=RECIPE override (a recipe name or pkg.mod:Class)."),
    hardware: str = typer.Option(
        "", "--hardware", help="Hardware (catalog name or spec file) for the time-share estimate."
    ),
    cost_model: str = typer.Option(
        "", "--cost-model", help="Cost model for the time-share estimate (with --hardware; default: a roofline)."
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Earlier results: print the run-to-run spread of medians against them."
    ),
    collectives: bool = typer.Option(
        False,
        "--collectives",
        help="Time collectives instead of ops, under `torchrun --nproc-per-node N` (NCCL on CUDA, gloo on the "
        "CPU): the GRAPHs' own, or a sweep of all_reduce, all_gather, reduce_scatter, all_to_all and broadcast "
        "over --sizes and groups of 2, 4, ... N ranks. OUT is JSONL for `calibrate --collectives`.",
    ),
    sizes: str = typer.Option(
        "4K..1G", "--sizes", help="--collectives sweep: LOW..HIGH (powers of two, or --points sizes) or 4K,1M,..."
    ),
    points: int | None = typer.Option(
        None, "--points", help="--collectives sweep: this many geometric sizes over --sizes LOW..HIGH."
    ),
    tp: int | None = typer.Option(
        None,
        "--tp",
        help="--collectives: shard GRAPHs without collectives for N tensor-parallel ranks first (as "
        "`simulate --tp N` does).",
    ),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 unless every config is ok."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary, no line per config."),
) -> None:
    """Replay every unique op config of the graphs on a device: check it against float64, time it.

    Results stream to OUT as JSONL, one record per config, flushed as measured.

    Ctrl-C or a crash loses nothing measured; `--resume` carries on.

    Under `torchrun --nproc-per-node N` the configs are sharded over ranks and rank 0 writes OUT.
    """
    from opgraph.ir import OpgraphError
    from validators.replay import ReplayOptions
    from validators.results import load_results, run_to_run
    from validators.runner import run_replay
    from validators.timing import TimingConfig

    if collectives:
        _replay_collectives(graphs or [], out, device, resume, sizes, points, tp, quiet)
        return
    for flag, used in (("--sizes", sizes != "4K..1G"), ("--points", points is not None), ("--tp", tp is not None)):
        if used:
            raise OpgraphError("only applies to collectives", where=flag, hint="add --collectives")
    if not graphs:
        raise OpgraphError("missing GRAPH", hint="give graphs saved by `opgraph capture`, or --collectives")
    recipes = _parse_recipes(recipe)
    wanted = parse_kinds(kinds)
    if baseline is not None and not baseline.exists():
        raise OpgraphError(
            "no such file", where=str(baseline), hint="give results written by an earlier `opgraph replay`"
        )
    if timer not in ("kernels", "events"):
        raise OpgraphError(f"unknown timer {timer!r}", where="--timer", hint="use kernels or events")
    _check_sampling(device, timer, min_samples, max_samples, limit)
    check_output_path(out, "-o/--out", inputs=[*graphs, baseline])
    estimate = _estimator(hardware, cost_model)
    options = ReplayOptions(
        timing=TimingConfig(
            warmup_ms=warmup_ms, min_samples=min_samples, max_samples=max_samples,
            max_time_s=max_time, target_ci=target_ci, cold_l2=cold_l2, timer=cast("CudaTimerKind", timer),
            warm_activations=warm_activations, kernel_sessions=max(3, sessions),
            max_kernel_sessions=max(3, sessions, max_sessions),
        ),
        check=check, reference_device=reference_device, check_max_flops=check_max_flops,
        energy=energy, energy_window_s=energy_window, seed=seed, moe_skew=moe_skew, recipes=recipes,
        issue_in_sequence=issue_in_sequence,
    )  # fmt: skip
    errc = err_console()

    def warn(msg: str) -> None:
        print(f"warning: {msg}", file=sys.stderr)

    def on_result(r: ReplayResult, i: int, n: int) -> None:
        if not quiet:
            console.print(_line(r, i, n))

    kinds_set = set(wanted)
    select = (lambda c: getattr(c.op, "kind").value in kinds_set) if kinds_set else None  # noqa: B009
    if issue_only:
        from validators.runner import time_issue

        if out.name.endswith((".jsonl", ".jsonl.gz")):
            raise OpgraphError(
                f"{out} names replay results, not issue times",
                where="--out",
                hint="with --issue-only give -o FILE.json (replay results are not overwritten)",
            )

        seq = time_issue([str(g) for g in graphs], device=device, out=out, options=options, select=select, warn=warn)
        total_ms = sum(seq.us_by_key.values()) / 1e3
        console.print(
            f"device: {seq.device_name} ({device}); issue in sequence: {len(seq.us_by_key)} configs, "
            f"{seq.calls} calls a round, {seq.rounds} rounds; {total_ms:.3f} ms over one call of each config"
        )
        console.print(f"issue times: {out} (use with `opgraph calibrate REPLAY.jsonl --issue {out}`)")
        return
    try:
        run = run_replay(
            [str(g) for g in graphs], device=device, out=out, resume=resume, options=options, estimate=estimate,
            select=select, limit=limit, on_result=on_result, warn=warn,
        )  # fmt: skip
    except KeyboardInterrupt:
        errc.print(f"interrupted: results measured so far are in {out}; rerun with --resume to continue")
        raise
    if run.rank != 0:
        return
    cov = run.coverage
    selected = len(run.configs)
    note = f" (of {run.total_configs} unique)" if selected != run.total_configs else ""
    console.print(
        f"device: {run.device_name} ({device}); {selected} configs{note}; {run.new} replayed now"
        + (f", {run.resumed} from an earlier run" if run.resumed else "")
        + (f"; {run.world_size} ranks" if run.world_size > 1 else "")
    )
    if energy and run.energy_note:
        warn(f"no energy: {run.energy_note}")
    console.print(cov.line())
    settling = timing_line(run.results, target_ci)
    if settling:
        console.print(settling, markup=False)
    if baseline is not None:
        console.print(run_to_run(load_results(baseline), run.results).line())
    console.print(f"results: {out}")
    if run.skipped_graphs:
        raise typer.Exit(1)
    if strict and any(r.status.value != "ok" for r in run.results):
        raise typer.Exit(1)


def timing_line(results: list[ReplayResult], target_ci: float, shown: int = 5) -> str:
    """The summary line about timings that did not converge (``""`` when all did): how many did not
    reach ``target_ci``, and which are unsettled (:attr:`~validators.results.TimingStats.instability`),
    the ones ``calibrate`` leaves out."""
    timed = [r for r in results if r.timing is not None]
    loose = [r for r in timed if r.timing is not None and not r.timing.converged]
    unsettled = [r for r in timed if r.timing is not None and r.timing.instability]
    if not loose and not unsettled:
        return ""
    line = f"timing: {len(loose)} of {len(timed)} timed configs did not reach --target-ci {target_ci:.2%}"
    if not unsettled:
        return line + " (none unsettled: each median is known within ±5%)"
    names = "; ".join(f"{r.definition} ({r.timing.instability})" for r in unsettled[:shown] if r.timing is not None)
    more = f"; {len(unsettled) - shown} more" if len(unsettled) > shown else ""
    return (
        f"{line}; {len(unsettled)} unsettled, which `opgraph calibrate` leaves out unless --keep-unconverged: "
        f"{names}{more}"
    )


def _check_sampling(device: str, timer: str, min_samples: int, max_samples: int, limit: int | None) -> None:
    """Refuse the sampling options that would be ignored or bent silently (one-line errors)."""
    from opgraph.ir import OpgraphError

    if timer != "kernels" and not device.startswith("cuda"):
        raise OpgraphError(
            f"--timer {timer} only applies to CUDA: on {device} every sample is timed by the host clock",
            where="--timer",
            hint="leave --timer out, or replay with --device cuda",
        )
    for flag, value in (("--min-samples", min_samples), ("--max-samples", max_samples)):
        if value < 1:
            raise OpgraphError(f"{value} is out of range", where=flag, hint="give 1 or more")
    if min_samples > max_samples:
        raise OpgraphError(
            f"{min_samples} is more than --max-samples {max_samples}",
            where="--min-samples",
            hint=f"give --min-samples at most {max_samples}, or raise --max-samples",
        )
    if limit is not None and limit < 1:
        raise OpgraphError(f"{limit} is out of range", where="--limit", hint="give 1 or more, or leave --limit out")


def _replay_collectives(
    graphs: list[Path], out: Path, device: str, resume: bool, sizes: str, points: int | None, tp: int | None,
    quiet: bool,
) -> None:  # fmt: skip
    """``replay --collectives``: time the graphs' collectives (sharded for ``tp`` first) or a sweep."""
    from opgraph.ir import OpgraphError, load_graph
    from opgraph.study import shard_for_tp
    from validators.collectives import format_measurement, run_collective_job

    if tp is not None and tp < 2:
        raise OpgraphError(f"{tp} ranks need no collective", where="--tp", hint="give 2 or more")
    if tp is not None and not graphs:
        raise OpgraphError("shards graphs: none given", where="--tp", hint="give GRAPH... or leave --tp out")
    if not out.name.endswith(".jsonl"):
        raise OpgraphError(
            f"{out} is not a .jsonl file", where="--out", hint="collective measurements are JSONL: -o collectives.jsonl"
        )
    check_output_path(out, "-o/--out", inputs=graphs)
    loaded = []
    for path in graphs:
        graph = load_graph(path)
        if tp is not None:
            graph, _ = shard_for_tp(graph, tp)
        loaded.append((str(path), graph))
    dev = device.split(":")[0]

    def show(m: CollectiveMeasurement) -> None:
        if not quiet:
            console.print(format_measurement(m), markup=False)

    def warn(msg: str) -> None:
        print(f"warning: {msg}", file=sys.stderr)

    job = run_collective_job(out, graphs=loaded, sizes=sizes, points=points, device=dev, resume=resume,
                             on_result=show, warn=warn)  # fmt: skip
    if job.rank != 0:
        return
    console.print(
        f"device: {job.device_name} ({job.device}); {len(job.results)} collective cases measured now over "
        f"{job.world_size} ranks"
    )
    console.print(f"results: {out} (fit them with `opgraph calibrate --collectives {out} -o fit.json`)")


def _estimator(hardware: str, cost_model: str) -> Estimator:
    """The per-op time estimate used for time shares: a cost model (default the roofline) on a device."""
    from opgraph.ir import OpgraphError
    from validators import cost_estimator

    if cost_model and not hardware:
        raise OpgraphError("a cost model needs a device", where="--cost-model", hint="give --hardware NAME as well")
    from hardware import load_hardware, resolve_cost_model

    return cost_estimator(
        load_hardware(hardware) if hardware else None, resolve_cost_model(cost_model) if cost_model else None
    )
