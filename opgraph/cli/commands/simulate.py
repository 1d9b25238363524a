"""``opgraph simulate GRAPH``: schedule a graph on a device's engines and report the timeline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from opgraph.cli.common import (
    check_distinct_outputs,
    check_host_time,
    check_output_path,
    command,
    console,
    is_tty,
    new_table,
    print_notes,
)
from opgraph.fmt import fmt_us
from opgraph.ir import OpgraphError

if TYPE_CHECKING:
    from opgraph.study import StudyResult
    from simulators import EngineSweep, SimulationConfig, SimulationResult, SimulationStats

MAX_SWEEP = 64
"""Most engine counts one sweep accepts."""

MAX_ENGINES = 4096
"""Largest engine count (the simulator's engine-group limit)."""

MAX_TP = 1024
"""Most tensor-parallel ranks (the limit of ``SimulationConfig.tp``)."""


class SimulateOptionError(OpgraphError):
    """A ``simulate`` option is out of range or malformed."""


def parse_engines(text: str) -> list[int]:
    """``3`` -> [3]; ``1..8`` (or ``1-8``) -> [1..8]; ``1,2,4`` -> [1, 2, 4]. Counts must be 1..4096.

    A range is checked against the limits before it is expanded, so ``1..10**12`` fails at once.

    >>> parse_engines("4,1,2")
    [1, 2, 4]
    """
    text = text.strip()
    if not text:
        raise SimulateOptionError("no engine count given", where="--engines", hint="give N, LOW..HIGH or 1,2,4")
    m = re.fullmatch(r"(\d+)\s*(?:\.\.|-)\s*(\d+)", text)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise SimulateOptionError(f"empty range {text!r}", where="--engines", hint="write LOW..HIGH, e.g. 1..8")
        if lo < 1 or hi > MAX_ENGINES:
            edge = "starts below 1, the smallest" if lo < 1 else f"goes above {MAX_ENGINES}, the largest"
            raise SimulateOptionError(
                f"the range {lo}..{hi} {edge} engine count allowed",
                where="--engines",
                hint=f"give counts within 1..{MAX_ENGINES}",
            )
        counts = list(range(lo, hi + 1))
    else:
        items = [part.strip() for part in text.split(",")]
        if "" in items:
            raise SimulateOptionError(
                f"{text!r} has an empty item", where="--engines", hint="separate counts by single commas, e.g. 1,2,4"
            )
        try:
            counts = [int(part) for part in items]
        except ValueError:
            raise SimulateOptionError(
                f"{text!r} is not an engine count", where="--engines", hint="give N, LOW..HIGH or a list like 1,2,4"
            ) from None
        bad = [c for c in counts if c < 1 or c > MAX_ENGINES]
        if bad:
            raise SimulateOptionError(
                f"engine count {bad[0]}{f' in {text!r}' if len(counts) > 1 else ''} is out of range",
                where="--engines",
                hint=f"each count must be 1..{MAX_ENGINES}",
            )
    if len(set(counts)) > MAX_SWEEP:
        raise SimulateOptionError(
            f"a sweep of {len(set(counts))} counts ({text}) is too long",
            where="--engines",
            hint=f"give at most {MAX_SWEEP} counts, e.g. a list like 1,2,4,8,16",
        )
    return sorted(set(counts))


def _host_mode(text: str) -> str:
    mode = text.strip().lower().replace("-", "_")
    if mode not in ("eager", "cuda_graph", "none"):
        raise SimulateOptionError(f"unknown host mode {text!r}", where="--host", hint="eager, cuda-graph or none")
    return mode


@command("simulate")
def simulate(
    ctx: typer.Context,
    graph_path: Path = typer.Argument(
        ..., metavar="GRAPH", help="A graph saved by `opgraph capture` (.json/.json.gz)."
    ),
    engines: str | None = typer.Option(
        None,
        "--engines",
        "-e",
        help="Compute engines: N (default 1), or a sweep LOW..HIGH / 1,2,4 that names the best count.",
    ),
    hardware: str = typer.Option("h100", "--hardware", "-H", help="Catalog name or a hardware .toml/.json file."),
    cost_model: str | None = typer.Option(
        None,
        "--cost-model",
        "-c",
        help="roofline, formula, table, profile, a calibrated or profile JSON, module:Class, file.py:Class "
        "(default: the device's measured profile when it ships one, else roofline).",
    ),
    cost_option: list[str] = typer.Option(
        [],
        "--cost-option",
        help="KEY=VALUE given to the cost model, repeatable (the profile model's writeback=false, "
        "check_hardware=false).",
    ),
    policy: str = typer.Option(
        "earliest", "--policy", "-p", help="earliest, critical-path, stream, module:Class or file.py:Class."
    ),
    independent_engines: bool = typer.Option(
        False,
        "--independent-engines",
        help="Give every engine a whole device (a hypothetical accelerator). Default: the ops running at "
        "once share the device's peak FLOP/s and bandwidth, so engines never beat its roofline.",
    ),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel ranks; collectives synchronise them."),
    no_shard: bool = typer.Option(
        False,
        "--no-shard",
        help="With --tp N: run the graph as given on every rank instead of sharding a graph "
        "without collectives Megatron-style first.",
    ),
    expert_parallel: bool = typer.Option(
        False,
        "--expert-parallel",
        help="With --tp N: split MoE experts by expert (each rank its experts' tokens) instead of inside each expert.",
    ),
    collective_fit: Path | None = typer.Option(
        None,
        "--collective-fit",
        help="Cost collectives from this measured fit (`opgraph calibrate --collectives`) instead of the "
        "hardware's link numbers; the cost model costs every other op.",
    ),
    copy_engines: int = typer.Option(0, "--copy-engines", help="Copy engines for MEMORY ops (0: they use compute)."),
    links: int = typer.Option(1, "--links", help="Communication links per communicator (collectives)."),
    host: str = typer.Option(
        "eager", "--host", help="Host issue model: eager, cuda-graph, or none (no host: every op issued at time zero)."
    ),
    host_us: float | None = typer.Option(
        None, "--host-us", help="Host time per op in us (default: the spec's); not with --host none."
    ),
    no_sync: bool = typer.Option(False, "--no-sync", help="The host does not wait for the device between steps."),
    framework_time: bool = typer.Option(
        True, help="Eager: add the framework's host time between ops captured with --host-timing."
    ),
    jitter: float = typer.Option(0.0, "--jitter", help="Relative noise of op times (log-normal sigma)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the noise."),
    skip_uncosted: bool = typer.Option(
        False, "--skip-uncosted", help="Simulate ops the cost model cannot cost as free (listed) instead of failing."
    ),
    config_path: Path | None = typer.Option(
        None,
        "--config",
        help="A SimulationConfig JSON (engine groups as data). Its settings stand unless the command line "
        "gives the flag: --engines sets its compute group's count, --copy-engines/--links its copy and link "
        "groups' (adding or, for --copy-engines 0, removing the group), any other flag its setting.",
    ),
    tolerance: float = typer.Option(0.01, "--tolerance", help="Sweep: counts within this of the best are as good."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the simulated Timeline (.json/.json.gz)."),
    stats_path: Path | None = typer.Option(
        None,
        "--stats",
        help="Write the statistics as JSON; for a sweep, what --json prints plus every engine count's "
        'statistics under "runs" (by count).',
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print the statistics as JSON instead of tables; for a sweep, {"sweep", "recommended"}: the sweep '
        "and the recommended count's statistics.",
    ),
    no_host_track: bool = typer.Option(False, "--no-host-track", help="Leave host launch spans out of the timeline."),
    open_trace: bool = typer.Option(False, "--open", help="Open the timeline in ui.perfetto.dev."),
) -> None:
    """Simulate GRAPH on a device: engines, host launches, policy, tensor parallelism.

    Prints makespan, per-engine utilisation, the critical path, time by kind and the host-bound
    share; with an engine range (``-e 1..8``) prints makespan per count and names the smallest
    count within ``--tolerance`` of the best.
    """
    from opgraph.ir import Gemm, load_graph, load_model, save_timeline
    from opgraph.study import run_study, study_config
    from simulators import SimulationConfig

    counts = parse_engines(engines) if engines is not None else []
    for name, value, low, high in (
        ("--tp", tp, 1, MAX_TP),
        ("--copy-engines", copy_engines, 0, MAX_ENGINES),
        ("--links", links, 1, MAX_ENGINES),
    ):
        if not low <= value <= high:
            raise SimulateOptionError(f"{value} is out of range", where=name, hint=f"give {low}..{high}")
    if not 0 <= jitter <= 2:
        raise SimulateOptionError(f"{jitter} is out of range", where="--jitter", hint="give 0..2")
    if host_us is not None and host_us < 0:
        raise SimulateOptionError(f"{host_us} is negative", where="--host-us")
    if not 0 <= tolerance < 1:
        raise SimulateOptionError(f"{tolerance} is out of range", where="--tolerance", hint="give 0 <= t < 1")
    mode = _host_mode(host)
    inputs = [graph_path, config_path, collective_fit]
    check_output_path(output, "-o/--output", inputs=inputs)
    check_output_path(stats_path, "--stats", inputs=inputs)
    check_distinct_outputs([(output, "-o/--output"), (stats_path, "--stats")])

    # With --config, the file's settings stand unless the command line gives the flag.
    base: SimulationConfig | None = None
    given: set[str] | None = None
    run_mode, host_us_where = mode, "--host-us"
    if config_path is not None:
        given = _given_options(ctx)
        # A file that gives a host time with host mode none is refused here (SimulationConfig's own
        # rule), one line naming the file and its host.per_op_us.
        base = load_model(config_path, SimulationConfig)
        base = _config_with_flags(base, given, config_path, copy_engines, links, framework_time)
        if "host" not in given:
            run_mode, host_us_where = base.host.mode.value, f"--host-us with --config {config_path}"
    check_host_time(run_mode, host_us, host_us_where)

    def flag(name: str, value: Any) -> Any:
        return value if given is None or name in given else None

    config = study_config(
        (counts or [base.engines if base is not None else 1])[0],
        base=base,
        copy_engines=copy_engines,
        links=links,
        policy=flag("policy", policy),
        tp=flag("tp", tp),
        host_mode=flag("host", mode),
        host_us=host_us,
        sync_each_step=flag("no_sync", not no_sync),
        framework=framework_time,
        record_host=flag("no_host_track", not no_host_track),
        jitter=flag("jitter", jitter),
        seed=flag("seed", seed),
        skip_uncosted=flag("skip_uncosted", skip_uncosted),
        independent_engines=True if independent_engines else None,
    )
    counts = counts or [config.engines]
    if expert_parallel and (config.tp <= 1 or no_shard):
        raise OpgraphError(
            "splits a graph's experts over the --tp ranks when it is sharded: it needs --tp above 1 and no --no-shard",
            where="--expert-parallel",
        )
    from_file = f"{config_path}: " if given is not None else ""
    _check_policy(config.policy, "--policy" if given is None or "policy" in given else f"{from_file}policy")
    hw = _load_hardware(hardware)  # after the cheap checks, before loading anything large
    default_note: tuple[str, ...] = ()
    from hardware import parse_cost_options

    options = parse_cost_options(cost_option)
    if cost_model is None:
        from hardware import default_cost_model

        model, uncalibrated = default_cost_model(hw, **options)
        default_note = (uncalibrated,) if uncalibrated else ()
    else:
        model = _load_cost_model(cost_model, options)
    graph = load_graph(graph_path)
    if expert_parallel and not any(isinstance(op, Gemm) and op.expert is not None for op in graph.ops):
        raise OpgraphError("the graph has no MoE expert GEMMs to split", where="--expert-parallel")
    tp = config.tp
    fitted = None
    if collective_fit is not None:
        model, fitted = _with_collective_fit(model, collective_fit, graph, tp)
    if graph.generation is not None and len(counts) == 1 and tp == 1:
        _simulate_generation(graph, hw, model, config, default_note, output, stats_path, as_json, graph_path)
        return
    with _progress(len(graph.ops) * tp * len(counts)) as tick:
        study = run_study(
            graph, hw, model, config, engines=counts, shard=not no_shard, expert_parallel=expert_parallel,
            tolerance=tolerance, progress=tick,
        )  # fmt: skip
    result, sweep = study.result, study.sweep
    fit_notes = _collective_fit_notes(fitted, collective_fit) if fitted is not None else ()
    extra_notes = (*default_note, *study.notes, *fit_notes)
    stats = _stats_of(result, extra_notes)

    if output is not None:
        save_timeline(result.timeline(), output)
    if stats_path is not None:
        _save_stats(study, stats, extra_notes, stats_path)
    if as_json:
        typer.echo(json.dumps(_stats_payload(study, extra_notes, every_run=False), indent=2))
    else:
        if sweep is not None:
            _print_sweep(sweep)
        _print_summary(result, stats, graph_path)
        if output is not None:
            console.print(f"timeline: {output} ({len(result.timeline())} spans)")
        if stats_path is not None:
            what = f" (every engine count of the sweep: {', '.join(map(str, counts))})" if sweep is not None else ""
            console.print(f"statistics{what}: {stats_path}")
    if open_trace:
        _open(result, output)


def _simulate_generation(
    graph: Any,
    hw: Any,
    model: Any,
    config: Any,
    default_note: tuple[str, ...],
    output: Path | None,
    stats_path: Path | None,
    as_json: bool,
    graph_path: Path,
) -> None:
    """A planned generation: the recorded part simulated op by op, the later steps from a few windows."""
    from hardware import cost_warnings
    from opgraph.ir import save_model, save_timeline
    from simulators import simulate_generation

    with cost_warnings() as warned:
        gen = simulate_generation(graph, hw, model, config)
    prefix = gen.prefix
    stats = prefix.stats()
    notes = (*stats.notes, *default_note, *warned, *gen.notes)
    stats = stats.model_copy(update={"notes": notes})
    plan = graph.generation
    steps = len(plan.steps) if plan is not None else 0
    if output is not None:
        save_timeline(gen.timeline(), output)
    if stats_path is not None:
        save_model(stats, stats_path)
    if as_json:
        payload = {
            "generation": {"makespan_us": gen.makespan_us, "planned_steps": steps, "notes": list(gen.notes)},
            "prefix": stats.model_dump(mode="json"),
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    _print_summary(prefix, stats, graph_path)
    console.print(
        f"generation: makespan {fmt_us(gen.makespan_us)} in all; the recorded part above "
        f"({fmt_us(prefix.makespan_us)}) plus {steps} planned step(s) simulated from {len(gen.windows)} window(s)"
    )
    if output is not None:
        console.print(f"timeline: {output}")
    if stats_path is not None:
        console.print(f"statistics (recorded part): {stats_path}")


# ---------------------------------------------------------------- helpers
def _given_options(ctx: typer.Context) -> set[str]:
    """Names of the options given on the command line (or the environment), not left at their default."""
    defaults = ("DEFAULT", "DEFAULT_MAP")
    return {
        name for name in ctx.params if (src := ctx.get_parameter_source(name)) is not None and src.name not in defaults
    }


def _config_with_flags(
    base: SimulationConfig,
    given: set[str],
    path: Path,
    copy_engines: int,
    links: int,
    framework_time: bool,
) -> SimulationConfig:
    """The --config file's settings with the group and framework-time flags the command line gave over them.

    :func:`opgraph.study.study_config` sets the other flags over the file, not these:
    ``--copy-engines``/``--links`` set the counts of the file's copy and link groups (adding or, for
    ``--copy-engines 0``, removing the group), and ``--framework-time`` turns the file's framework
    time back on. (``--host none`` without ``--host-us`` drops the file's host time per op in
    ``study_config``: no host, no host time.)
    """
    for name, option, count in (("copy_engines", "--copy-engines", copy_engines), ("links", "--links", links)):
        if name not in given:
            continue
        try:
            base = base.with_copy_engines(count) if name == "copy_engines" else base.with_links(count)
        except ValueError as exc:
            raise SimulateOptionError(
                _first_error(exc),
                where=f"{option} with --config {path}",
                hint=f"set the count in the file, or drop {option}",
            ) from None
    host = base.host
    if "framework_time" in given:
        host = host.model_copy(update={"framework": framework_time})
    return base.model_copy(update={"host": host})


def _first_error(exc: ValueError) -> str:
    """A validation error as one message: pydantic's first error, without its ``Value error,`` prefix."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"{loc}: {msg}" if loc else msg
    return str(exc)


def _check_policy(spec: str, where: str) -> None:
    """Fail early, before loading anything large, when the policy cannot be found or built."""
    from simulators.policies import get_policy

    try:
        get_policy(spec)
    except OpgraphError as exc:
        raise SimulateOptionError(exc.message, where=where, hint=exc.hint) from None


def _stats_of(result: SimulationResult, notes: tuple[str, ...]) -> SimulationStats:
    """The run's statistics with the notes of the study (cost model, sharding, collective fit) added."""
    stats = result.stats()
    return stats.model_copy(update={"notes": (*stats.notes, *notes)}) if notes else stats


def _stats_payload(study: StudyResult, notes: tuple[str, ...], *, every_run: bool) -> dict[str, Any]:
    """What ``--json`` prints and ``--stats`` writes: one run's statistics; for a sweep,
    ``{"sweep", "recommended"}`` (the recommended count's statistics), and with ``every_run`` also
    ``"runs"``: every engine count's statistics by count."""
    stats = _stats_of(study.result, notes).model_dump(mode="json")
    if study.sweep is None:
        return stats
    payload: dict[str, Any] = {"sweep": study.sweep.model_dump(mode="json"), "recommended": stats}
    if every_run:
        payload["runs"] = {str(n): _stats_of(r, notes).model_dump(mode="json") for n, r in study.results.items()}
    return payload


def _save_stats(study: StudyResult, stats: SimulationStats, notes: tuple[str, ...], path: Path) -> None:
    """``--stats``: the run's :class:`~simulators.SimulationStats`; for a sweep, every count's (see ``--stats``)."""
    from opgraph.ir import save_model
    from opgraph.ir.io import atomic_write

    if study.sweep is None:
        save_model(stats, path)
        return
    with atomic_write(path) as f:
        f.write(json.dumps(_stats_payload(study, notes, every_run=True)).encode())


def _load_hardware(name: str) -> Any:
    try:
        from hardware import load_hardware
    except ImportError as exc:  # pragma: no cover - the hardware package ships with opgraph
        raise SimulateOptionError(f"the hardware catalog is not available ({exc})", where="--hardware") from None
    return load_hardware(name)


def _load_cost_model(spec: str, options: dict[str, object]) -> Any:
    try:
        from hardware import resolve_cost_model
    except ImportError as exc:  # pragma: no cover
        raise SimulateOptionError(f"cost models are not available ({exc})", where="--cost-model") from None
    return resolve_cost_model(spec, **options)


def _with_collective_fit(model: Any, path: Path, graph: Any, tp: int) -> tuple[Any, Any]:
    """``model`` with collectives costed by the measured fit at ``path``: (the wrapped model, the wrapper)."""
    from hardware.collective_fit import CalibratedCollectiveModel, CollectiveCalibration, CollectivesCostedApart
    from opgraph.ir import OpKind

    if tp < 2 and not graph.ops_of(OpKind.COLLECTIVE):
        raise SimulateOptionError(
            "the graph has no collective to cost with the fit",
            where="--collective-fit",
            hint="give --tp N (2 or more) to shard it, or a graph with collectives",
        )
    calibration = CollectiveCalibration.load(path)
    wrapped = CollectivesCostedApart(model, CalibratedCollectiveModel(calibration))
    return wrapped, wrapped


def _collective_fit_notes(fitted: Any, path: Path | None) -> tuple[str, ...]:
    """What the user should know about the collectives' costs: their source, and any the fit lacked."""
    cal = fitted.collectives.calibration
    where = f" (measured on {cal.device_name})" if cal.device_name else ""
    notes = [f"collectives costed by the measured fit {path}{where}"]
    if fitted.declined:
        names = sorted(fitted.declined)
        notes.append(
            f"{len(names)} collective config(s) not in the fit, costed by the cost model instead: "
            + ", ".join(names[:5])
            + (" ..." if len(names) > 5 else "")
        )
    return tuple(notes)


class _NoProgress:
    def __enter__(self) -> Any:
        return lambda done, total: None

    def __exit__(self, *exc: object) -> None:
        return None


class _Progress:
    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("simulating"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("sim", total=1.0)

    def __enter__(self) -> Any:
        self.bar.start()

        def tick(done: int, total: int) -> None:
            self.bar.update(self.task, completed=done / total if total else 1.0)

        return tick

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _progress(work: int) -> _NoProgress | _Progress:
    """A progress bar on a terminal for long runs (over ~200k simulated ops)."""
    if is_tty(console.file) and work > 200_000:  # a real terminal, not FORCE_COLOR into a pipe
        return _Progress()
    return _NoProgress()


def _print_sweep(sweep: EngineSweep) -> None:
    table = new_table(title="engine sweep", title_justify="left")
    table.add_column("engines", justify="right")
    table.add_column("makespan", justify="right")
    table.add_column("vs best", justify="right")
    table.add_column("speedup", justify="right")
    table.add_column("utilisation", justify="right")
    for p in sweep.points:
        mark = " *" if p.engines == sweep.recommended else ""
        table.add_row(
            f"{p.engines}{mark}",
            fmt_us(p.makespan_us),
            f"+{(p.makespan_us / sweep.best_makespan_us - 1) * 100:.1f}%" if sweep.best_makespan_us else "-",
            f"{p.speedup:.2f}x",
            f"{p.utilization * 100:.0f}%",
        )
    console.print(table)
    console.print(
        f"recommended: {sweep.recommended} engine(s), the smallest count within {sweep.tolerance * 100:g}% of the "
        f"best makespan {fmt_us(sweep.best_makespan_us)} (critical path {fmt_us(sweep.critical_path_us)})"
    )


def host_model(result: SimulationResult, stats: SimulationStats) -> str:
    """What the host issue model of the run really was, for the summary's host line.

    ``host eager 10 us/op`` when every op took the one time per op; when the cost model gave ops
    their own measured issue times (a profile, a calibrated table), says so with how many and their
    median, and the mean time the host spent per op (framework time between ops included).
    """
    import statistics

    host = stats.host
    config = result.config
    pb = result.problem
    issued = [h for h in result.kernel.host_us if h > 0]
    framework = any("of framework time between ops" in n for n in stats.notes)
    mean = f"{statistics.fmean(issued):.3g} us/op on average" if issued else ""
    if host.mode == "eager" and config.host.per_op_us is None and pb.host_us:
        own = [m for m, free in zip(pb.host_us, pb.free, strict=True) if m is not None and m > 0 and not free]
        if own:
            with_ops = len(pb) - sum(pb.free)
            others = f", {host.per_op_us:g} us for the others" if len(own) < with_ops else ""
            model = result.cost_model_name or "the cost model"
            return (
                f"host eager: per-op issue times from {model} ({len(own)} of {with_ops} ops, median "
                f"{statistics.median(own):.3g} us{others})"
                + (f", {mean} with framework time between ops" if framework and mean else "")
            )
    line = f"host {host.mode} {host.per_op_us:g} us/op"
    return line + (f" + framework time between ops ({mean})" if framework and mean else "")


def _print_summary(result: SimulationResult, stats: SimulationStats, path: Path) -> None:
    config = result.config  # the run shown (a sweep's recommended count), not the sweep's first
    model = result.problem.graph.metadata.model or path.name
    console.print(
        f"[bold]{model}[/bold] on {result.hardware_name or '-'}  cost model {result.cost_model_name}  "
        f"policy {stats.policy}  engines {config.engines}" + (f"  tp {config.tp}" if config.tp > 1 else "")
    )
    if config.engines > 1 or config.independent_engines:
        console.print(
            "engines: each runs one op at a time (a stream's worth of concurrency); "
            + (
                "independent: every engine has a whole device's peaks (a hypothetical accelerator)"
                if config.independent_engines
                else "ops running at once share the device's peak FLOP/s and bandwidth"
            )
        )
    cp = stats.critical_path
    host = stats.host
    console.print(
        f"makespan {fmt_us(stats.makespan_us)}   serial {fmt_us(stats.serial_us)}   speedup {stats.speedup:.2f}x   "
        f"critical path {fmt_us(cp.length_us)} ({cp.share * 100:.0f}% of makespan, {len(cp.ops)} ops)"
    )
    console.print(
        f"{host_model(result, stats)}: issued all by {fmt_us(host.issue_end_us)}, "
        f"host-bound {fmt_us(host.host_bound_us)} ({host.host_bound_share * 100:.0f}% of makespan)"
        + (f", {host.sync_points} sync point(s)" if host.sync_points else "")
    )
    eng = new_table(title=None)
    eng.add_column("engine")
    eng.add_column("ops", justify="right")
    eng.add_column("busy", justify="right")
    eng.add_column("utilisation", justify="right")
    shown = [e for e in stats.engines if e.ops or e.group == config.compute_group.name]
    for e in shown[:32]:
        eng.add_row(e.track, str(e.ops), fmt_us(e.busy_us), f"{e.utilization * 100:.0f}%")
    if len(shown) > 32:
        eng.add_row(f"... {len(shown) - 32} more", "", "", "")
    console.print(eng)
    kinds = new_table(title=None)
    kinds.add_column("kind")
    kinds.add_column("ops", justify="right")
    kinds.add_column("time", justify="right")
    kinds.add_column("share", justify="right")
    for kind, row in list(stats.by_kind.items())[:12]:
        kinds.add_row(kind, str(row.ops), fmt_us(row.busy_us), f"{row.share * 100:.1f}%")
    console.print(kinds)
    layers = [k for k in stats.by_layer if k != "none"]
    if layers:
        top = max(layers, key=lambda k: stats.by_layer[k].busy_us)
        console.print(f"layers: {len(layers)}, the slowest is layer {top} ({fmt_us(stats.by_layer[top].busy_us)})")
    if any(stats.collective_wait_us):
        waits = ", ".join(fmt_us(w) for w in stats.collective_wait_us)
        console.print(f"collective wait per rank: {waits}")
    if stats.uncosted:
        console.print(
            f"[yellow]skipped {len(stats.uncosted)} uncosted op(s) as free:[/yellow] "
            + ", ".join(f"{u.op_id} {u.kind}" for u in stats.uncosted[:10])
            + (" ..." if len(stats.uncosted) > 10 else "")
        )
    print_notes(stats.notes)


def _open(result: SimulationResult, output: Path | None) -> None:
    import tempfile

    from opgraph.export import open_in_perfetto, write_perfetto

    if output is not None:
        trace = output.with_name(output.name.split(".")[0] + ".perfetto.json")
    else:
        trace = Path(tempfile.mkdtemp(prefix="opgraph-sim-")) / "simulated.perfetto.json"
    write_perfetto(result.rank_timelines(), trace, graph=result.problem.graph)
    console.print(f"perfetto trace: {trace}")
    open_in_perfetto(trace)
