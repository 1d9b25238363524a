"""``opgraph validate MODEL_OR_GRAPH --device cuda -o DIR``: how close is the prediction, on this machine?

One command for the method of ``benchmarks/gpu/accuracy.py`` (issue 18 item 6), through what the
other commands do: capture on meta with host timing (``capture --host-timing``; given a GRAPH,
that graph), replay every unique config on the device (``replay``, the L2 flushed before each
call), time the host issue of the graph's ops in order right before the run (``replay
--issue-only``, CUDA), fit a cost table (``calibrate --issue``), run the real model under the
profiler (``capture --device DEVICE --profile``), simulate with the table (one in-order stream,
eager host; the replayed graph, which is the profiled one op for op with the host gaps timed on
meta) and compare (``compare``). Everything lands in one folder, written whole or not at all, and
``summary.json`` lists each step that ran with the command that reproduces it (every setting given).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from opgraph.cli.common import check_output_path, console, handle_errors, new_table, print_notes
from opgraph.ir import OpgraphError

if TYPE_CHECKING:
    from opgraph.capture.phase import CaptureOptions
    from opgraph.ir import OpGraph
    from opgraph.scenario.validation import ValidationStep, ValidationSummary

__all__ = ["ValidateSettings", "ValidationStep", "ValidationSummary", "register", "validate"]


def __getattr__(name: str) -> Any:
    """``ValidationStep`` and ``ValidationSummary`` (defined in :mod:`opgraph.scenario.validation`), imported
    on first use: importing the scenario package at CLI start would slow every command."""
    if name in ("ValidationStep", "ValidationSummary"):
        from opgraph.scenario import validation

        return getattr(validation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ValidateError(OpgraphError):
    """``validate`` cannot run as asked (no CUDA, a graph whose model cannot be found, ...)."""


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the app."""
    app.command("validate")(validate)


@handle_errors
def validate(
    target: str = typer.Argument(
        ...,
        metavar="MODEL_OR_GRAPH",
        help="A model (preset, config.json, folder: captured on meta with host timing) or a graph of `opgraph "
        "capture` (its model is profiled: --model, else the graph's model name).",
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Output folder (replaced whole when the run succeeds, never half-written)."
    ),
    device: str = typer.Option("cuda", "--device", "-d", help="cuda, cuda:N or cpu (a smoke run of the method)."),
    hardware: str | None = typer.Option(
        None, "--hardware", "-H", help="The device's catalog name or file (default: h100 on cuda, cpu on cpu)."
    ),
    model: str | None = typer.Option(None, "--model", help="With a GRAPH: the model to profile (preset, path)."),
    phase: str = typer.Option("prefill", help="MODEL: prefill or decode."),
    batch: int = typer.Option(1, help="MODEL: sequences."),
    seq_len: int = typer.Option(512, help="MODEL: prompt tokens per sequence (prefill)."),
    kv_len: int = typer.Option(2048, help="MODEL: tokens already in the KV cache (decode)."),
    dtype: str = typer.Option("bf16", help="MODEL: bf16, fp16 or fp32."),
    layers: int | None = typer.Option(None, help="MODEL: cut the model to its first N layers."),
    attn_impl: str = typer.Option("sdpa", help="MODEL: sdpa or eager."),
    warm_l2: bool = typer.Option(
        False,
        "--warm-l2",
        help="Replay with a warm L2 (default: flushed before each call, as a forward pass reads "
        "each weight once; `replay --cold-l2`).",
    ),
    check: bool = typer.Option(True, "--check/--no-check", help="Replay: compare each op with a float64 reference."),
    max_time: float = typer.Option(1.0, "--max-time", help="Replay: most seconds of sampling per config."),
    wall_repeats: int = typer.Option(9, "--wall-repeats", help="Profiled run: plain runs timed (their median)."),
    keep_unconverged: bool = typer.Option(
        False,
        "--keep-unconverged",
        help="Calibrate: fit timings whose confidence interval never settled, as measured (a noisy machine); "
        "`calibrate --keep-unconverged`.",
    ),
) -> None:
    """Validate the prediction on this machine: replay, calibrate, a profiled run, simulate and compare.

    Prints the end-to-end and per-kind comparison of the calibrated simulation with the measured
    run, and writes the graph, replay results, issue times, calibrated table, profiled graph and
    timeline, simulated timeline, comparison and summary.json into the output folder.
    """
    from opgraph.capture.phase import check_device, parse_device
    from opgraph.scenario.folder import check_run_folder, staged_folder

    dev = device.partition(":")[0]
    if dev not in ("cuda", "cpu"):
        raise ValidateError(f"unknown device {device!r}", where="--device", hint="cuda, cuda:N or cpu")
    # Every step runs on this one device, the profiled run (a capture) too: checked as capture checks
    # it (``cuda:x`` has no index, ``cuda:N`` must be visible), before anything long runs.
    device = parse_device(device)
    if wall_repeats < 1:
        raise ValidateError(f"{wall_repeats} is out of range", where="--wall-repeats", hint="give 1 or more")
    if not max_time > 0:
        raise ValidateError(f"{max_time} is out of range", where="--max-time", hint="give seconds above 0")
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValidateError("CUDA is not available here", where="--device", hint="use --device cpu for a smoke run")
        check_device(device)
    check_output_path(output, "-o/--output", inputs=[Path(target)], folder=True)
    check_run_folder(output)
    hw_name = hardware or ("h100" if dev == "cuda" else "cpu")
    from hardware import load_hardware

    hw = load_hardware(hw_name)
    graph, model_id, kw = _graph_and_model(
        target, model,
        dict(phase=phase, batch=batch, seq_len=seq_len, kv_len=kv_len, dtype=dtype, layers=layers,
             attn_impl=attn_impl),
    )  # fmt: skip
    settings = ValidateSettings(model_id=model_id, capture=kw, device=device, hardware=hw_name, warm_l2=warm_l2,
                                check=check, max_time=max_time, wall_repeats=wall_repeats,
                                keep_unconverged=keep_unconverged)  # fmt: skip
    settings.profile_options.validate()  # a given graph's settings too, before the long steps
    with staged_folder(output) as tmp:
        summary = _run(tmp, output, graph, settings, hw, captured=not _is_graph_file(target))
    console.print(f"wrote {output}/ (summary.json and {len(list(output.iterdir())) - 1} files)")
    del summary


# ---------------------------------------------------------------- steps
def _graph_and_model(target: str, model: str | None, opts: dict[str, Any]) -> tuple[OpGraph, str, dict[str, Any]]:
    """The graph to replay, the model to profile and the capture settings of both."""
    from opgraph.capture.api import CaptureOptions
    from opgraph.capture.sources import resolve
    from opgraph.ir import capture_settings, load_graph

    if _is_graph_file(target):
        graph = load_graph(target)
        md = graph.metadata
        if md.phase not in ("prefill", "decode"):
            raise ValidateError(
                f"the graph's phase is {md.phase or 'unknown'!r}",
                where=target,
                hint="validate a prefill or decode graph (capture --phase prefill|decode)",
            )
        settings = capture_settings(md.capture)
        kw: dict[str, Any] = {"phase": md.phase}
        for key in ("batch", "seq_len", "kv_len", "dtype", "layers", "attn_impl", "moe_skew"):
            value = getattr(settings, key)
            if value is not None:
                kw[key] = value
        if settings.weights == "checkpoint":  # the profiled run measures the model the graph holds
            kw["weights"] = True
        model_id = model or md.model
        try:
            resolve(model_id)
        except OpgraphError:
            raise ValidateError(
                f"the graph's model {model_id!r} cannot be found to profile it",
                where=target,
                hint="give --model PRESET_OR_PATH (the config.json or folder it was captured from)",
            ) from None
        return graph, model_id, kw
    if model is not None:
        raise ValidateError("only applies to a GRAPH", where="--model", hint="leave it out when validating a model")
    if opts["phase"] not in ("prefill", "decode"):
        raise ValidateError(f"{opts['phase']!r} cannot be validated", where="--phase", hint="prefill or decode")
    kw = {k: v for k, v in opts.items() if v is not None}
    CaptureOptions(device="meta", **kw).validate()
    from opgraph.capture import capture

    return capture(target, device="meta", host_timing=True, **kw), target, kw


def _is_graph_file(target: str) -> bool:
    path = Path(target)
    if target.endswith(".json.gz"):
        return True
    if not target.endswith(".json") or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "ops" in data and "metadata" in data


_CAPTURE_FLAGS = {
    "phase": "--phase", "batch": "--batch", "seq_len": "--seq-len", "kv_len": "--kv-len", "dtype": "--dtype",
    "layers": "--layers", "attn_impl": "--attn-impl", "moe_skew": "--moe-skew",
}  # fmt: skip
"""Capture settings as ``opgraph capture`` takes them, in the order the recorded commands give them."""

_UNREAD_BY_PHASE = {"prefill": "kv_len", "decode": "seq_len"}
"""The size a phase does not read (``opgraph capture`` refuses it): a prefill's prompt is ``seq_len``, a decode
step's context ``kv_len``."""


def _capture_args(kw: Mapping[str, Any]) -> list[str]:
    """Every capture setting in ``kw`` that the phase reads, as ``opgraph capture`` flags (none left to a default)."""
    unread = _UNREAD_BY_PHASE.get(str(kw.get("phase")))
    args: list[str] = []
    for key, flag in _CAPTURE_FLAGS.items():
        value = kw.get(key)
        if value is not None and key != unread:
            args += [flag, str(value)]
    return args


def _run_cli(args: list[str]) -> list[str]:
    """Run ``opgraph ARGS`` in-process and return the warnings it printed (``warning: `` dropped).

    Its printed output is held back; its failure ends ``validate`` with its one error line and exit status.
    """
    import contextlib
    import io
    import sys

    import typer.main

    from opgraph.cli.app import app

    err = io.StringIO()
    with console.capture(), contextlib.redirect_stderr(err):
        code = typer.main.get_command(app).main(args=args, prog_name="opgraph", standalone_mode=False)
    lines = err.getvalue().splitlines()
    if isinstance(code, int) and code != 0:
        errors = [line for line in lines if line.startswith("error: ")] or lines[-1:]
        print("\n".join(errors), file=sys.stderr)
        raise typer.Exit(code)
    return [line.removeprefix("warning: ") for line in lines if line.strip()]


def _command(*args: object) -> str:
    """A command line a shell reads back as ``args`` (paths with spaces quoted)."""
    import shlex

    return shlex.join(["opgraph", *map(str, args)])


@dataclass(frozen=True)
class ValidateSettings:
    """The settings of one ``validate`` run that change what a step measures or computes.

    The steps run with these, and the commands recorded in ``summary.json`` are built from them
    (:meth:`capture_command` ... :meth:`profile_command`), each giving every one its step reads, so
    that a recorded command run on the folder's files reproduces its step.
    """

    model_id: str
    """The model captured and profiled (a preset, config.json or folder)."""
    capture: Mapping[str, Any]
    """Capture settings (``phase``, ``batch``, ``seq_len``, ...) as :class:`~opgraph.capture.CaptureOptions` names
    them."""
    device: str
    """``cuda``, ``cuda:N`` or ``cpu``: every step that runs on a device runs on this one (the replay, the
    issue timing and the profiled run; the graph is captured on meta), and their recorded commands give it."""
    hardware: str
    """The device's catalog name or spec file (``--hardware``)."""
    warm_l2: bool
    """Replay with a warm L2 (on CUDA the L2 is otherwise flushed before each call)."""
    check: bool
    """Replay: compare each op with a float64 reference."""
    max_time: float
    """Replay: most seconds of sampling per config."""
    wall_repeats: int
    """Profiled run: plain runs timed (their median is the measured wall)."""
    keep_unconverged: bool = False
    """Calibrate: fit unsettled timings as measured (``calibrate --keep-unconverged``)."""

    @property
    def profile_options(self) -> CaptureOptions:
        """The profiled run's capture options: :attr:`capture` on :attr:`device`, as :meth:`profile_command`
        gives them (checked when made: a :class:`~opgraph.capture.CaptureError` names the option at fault)."""
        from opgraph.capture.phase import CaptureOptions

        return CaptureOptions(device=self.device, **self.capture)

    @property
    def cold_l2(self) -> bool:
        """Whether the replays flush the L2 before each call: on CUDA, unless :attr:`warm_l2`."""
        return self.device.split(":")[0] == "cuda" and not self.warm_l2

    def _l2_flag(self) -> str:
        return "--cold-l2" if self.cold_l2 else "--warm-l2"

    def capture_command(self, folder: Path) -> str:
        """``opgraph capture`` on meta with host timing: the graph the run replays, ``graph.json.gz``."""
        return _command("capture", self.model_id, *_capture_args(self.capture), "--device", "meta", "--host-timing",
                        "-o", folder / "graph.json.gz")  # fmt: skip

    def replay_command(self, folder: Path) -> str:
        """``opgraph replay`` of every unique config of the graph: ``replay.jsonl``."""
        return _command("replay", folder / "graph.json.gz", "--device", self.device, self._l2_flag(),
                        "--check" if self.check else "--no-check", "--max-time", self.max_time,
                        "--hardware", self.hardware, "-o", folder / "replay.jsonl")  # fmt: skip

    def issue_command(self, folder: Path) -> str:
        """``opgraph replay --issue-only``: the host issue times of the graph's ops in order, ``issue.json``."""
        return _command("replay", folder / "graph.json.gz", "--device", self.device, "--issue-only",
                        self._l2_flag(), "--no-check", "--no-energy", "--max-time", self.max_time,
                        "-o", folder / "issue.json")  # fmt: skip

    def profile_command(self, folder: Path) -> str:
        """``opgraph capture --profile`` on the device: ``profiled.graph.json.gz`` and ``measured.timeline.json.gz``."""
        weights = ["--weights"] if self.capture.get("weights") else []  # a graph of the checkpoint's weights
        return _command("capture", self.model_id, *_capture_args(self.capture), *weights, "--device", self.device,
                        "--profile", "--wall-repeats", self.wall_repeats, "-o", folder / "profiled.graph.json.gz",
                        "--timeline", folder / "measured.timeline.json.gz")  # fmt: skip


def _run(
    tmp: Path, output: Path, graph: OpGraph, settings: ValidateSettings, hw: Any, *, captured: bool
) -> ValidationSummary:
    """Every step into ``tmp`` (the staged folder); prints the tables; returns the summary it wrote.

    Each step runs with the settings its recorded command gives (both come from ``settings``), so
    that the command, run on the folder's files, writes the same file (the same numbers where the
    step computes rather than measures).
    """
    from hardware import TableModel
    from hardware.models.table import CostTable
    from opgraph.capture.profile import profile_capture
    from opgraph.cli.commands.compare import _comparable
    from opgraph.compare import compare_timelines, comparison_tables
    from opgraph.ir import save_graph, save_model, save_timeline
    from opgraph.scenario.validation import ValidationStep, ValidationSummary
    from opgraph.study import run_study, study_config
    from validators import ReplayOptions, TimingConfig, cost_estimator, run_replay

    s = settings
    device, dev, hw_spec, wall_repeats = s.device, s.device.split(":")[0], s.hardware, s.wall_repeats
    steps: list[ValidationStep] = []
    notes: list[str] = []

    def at(name: str) -> str:
        """``name`` in the output folder, as the recorded commands name it."""
        return str(output / name)

    def step(name: str, t0: float, command: str, files: tuple[str, ...] = (), detail: str = "") -> None:
        steps.append(ValidationStep(name=name, done=True, detail=detail, command=command, files=files,
                                    seconds=time.perf_counter() - t0))  # fmt: skip
        console.print(f"[bold]{name}[/bold]: {detail or 'done'} ({time.perf_counter() - t0:.1f} s)")

    # 1. the graph (captured on meta with host timing, or given)
    t0 = time.perf_counter()
    save_graph(graph, tmp / "graph.json.gz")
    host_timed = graph.metadata.host_timing is not None
    if not host_timed:
        notes.append("the graph has no host timing: the simulated wall time has no framework time between ops "
                     "(capture the model with --host-timing)")  # fmt: skip
    ops_detail = f"{len(graph.ops)} ops" + (", host timed" if host_timed else "")
    if captured:
        step("capture", t0, s.capture_command(output), ("graph.json.gz",), ops_detail)
    else:  # the given graph, copied in: no command ran
        step("graph", t0, "", ("graph.json.gz",), f"the given graph ({ops_detail})")

    # 2. replay every unique config (as `opgraph replay`, the L2 flushed before each call on CUDA)
    t0 = time.perf_counter()
    timing = TimingConfig(cold_l2=s.cold_l2, max_time_s=s.max_time)
    options = ReplayOptions(timing=timing, check=s.check)
    run = run_replay([str(tmp / "graph.json.gz")], device=device, out=tmp / "replay.jsonl", options=options,
                     estimate=cost_estimator(hw))  # fmt: skip
    step("replay", t0, s.replay_command(output), ("replay.jsonl",), f"{run.device_name}: {run.coverage.line()}")
    if dev != "cuda":
        notes.append("the CPU replay times each op as a whole call (no L2 flush, no kernel timer)")

    # 3. host issue right before the run (CUDA)
    t0 = time.perf_counter()
    issue_us: dict[str, float] = {}
    if dev == "cuda":
        from validators.runner import time_issue

        issue_opts = ReplayOptions(check=False, energy=False, timing=timing)  # `--no-check --no-energy`
        seq = time_issue([str(tmp / "graph.json.gz")], device=device, out=tmp / "issue.json", options=issue_opts)
        issue_us = seq.us_by_key
        step("issue", t0, s.issue_command(output), ("issue.json",),
             f"{len(issue_us)} configs issued in the graph's order")  # fmt: skip
    else:
        notes.append("no issue timing (it needs CUDA: on a CPU a call runs the whole op): the calibration takes "
                     "the replay's host times")  # fmt: skip

    # 4. calibrate: `opgraph calibrate` itself, in-process, so that what it fits (and leaves out) is
    # exactly what its recorded command does on the folder's files
    t0 = time.perf_counter()

    def calibrate_args(place: Callable[[str], str]) -> list[str]:
        issue_args = ["--issue", place("issue.json")] if issue_us else []
        keep = ["--keep-unconverged"] if s.keep_unconverged else []
        calibrated = ["--hardware", hw_spec, "-o", place("calibrated.json")]
        return ["calibrate", place("replay.jsonl"), *issue_args, *keep, *calibrated]

    notes += [f"calibrate: {w}" for w in _run_cli(calibrate_args(lambda name: str(tmp / name)))]
    table = CostTable.load(tmp / "calibrated.json")
    fitted = f"{len(table.entries)} configs" + (f", issue times from {len(issue_us)} configs" if issue_us else "")
    step("calibrate", t0, _command(*calibrate_args(at)), ("calibrated.json",), fitted)

    # 5. the real model under the profiler (as `opgraph capture --profile`: the graph and timeline it writes)
    t0 = time.perf_counter()
    pc = profile_capture(s.model_id, wall_repeats=wall_repeats, **s.profile_options.model_dump())
    save_graph(pc.graph, tmp / "profiled.graph.json.gz")
    save_timeline(pc.timeline, tmp / "measured.timeline.json.gz")
    routing = [a for a in pc.graph.metadata.assumptions if "MoE routing is modelled" in a]
    if routing:
        notes.append("the profiled run is not the unmodified model: capture replaces its MoE routing (" + routing[0]
                     + "); issue 18 item 5 asks for the model's own routing")  # fmt: skip
    profile_detail = f"wall {pc.wall_us:,.1f} us (median of {wall_repeats}), {len(pc.timeline.spans)} spans"
    step("profile", t0, s.profile_command(output), ("profiled.graph.json.gz", "measured.timeline.json.gz"),
         profile_detail)  # fmt: skip

    # 6. simulate with the table (one in-order stream, eager host). The replayed graph is the profiled
    # one op for op (same ids, same configs) and holds the host gaps timed on meta: simulating it
    # predicts the profiled run's ops with the framework's time between them.
    t0 = time.perf_counter()
    if host_timed and _same_ops(graph, pc.graph):
        sim_graph, sim_file = graph, "graph.json.gz"
    else:
        sim_graph, sim_file = pc.graph, "profiled.graph.json.gz"
        if host_timed:
            notes.append("the profiled graph differs from the replayed one op for op: the profiled graph is "
                         "simulated, without the meta's host gaps")  # fmt: skip
    config = study_config(1, policy="stream", skip_uncosted=True)
    study = run_study(sim_graph, table.hardware or hw, TableModel(table), config)
    simulated = study.result.timeline()
    save_timeline(simulated, tmp / "simulated.timeline.json.gz")
    uncosted = study.result.stats().uncosted
    if uncosted:
        notes.append(f"{len(uncosted)} op(s) the table could not cost were simulated as free")
    step("simulate", t0, _command("simulate", at(sim_file), "--hardware", at("calibrated.json"), "--cost-model",
                                  at("calibrated.json"), "--engines", 1, "--policy", "stream", "--host", "eager",
                                  "--skip-uncosted", "-o", at("simulated.timeline.json.gz")),
         ("simulated.timeline.json.gz",), f"makespan {study.result.stats().makespan_us:,.1f} us")  # fmt: skip

    # 7. compare (as `opgraph compare --json`: the CPU profile read as its device work, with the same notes)
    t0 = time.perf_counter()
    compare_notes: list[str] = []
    pred = _comparable(simulated, tmp / "simulated.timeline.json.gz", "predicted", compare_notes)
    ref = _comparable(pc.timeline, tmp / "measured.timeline.json.gz", "reference", compare_notes)
    comparison = compare_timelines(pred, ref, graph=pc.graph)
    if compare_notes:
        comparison = comparison.model_copy(update={"notes": (*compare_notes, *comparison.notes)})
    save_model(comparison, tmp / "comparison.json")
    step("compare", t0, _command("compare", at("simulated.timeline.json.gz"), at("measured.timeline.json.gz"),
                                 "--graph", at("profiled.graph.json.gz"), "--json", at("comparison.json")),
         ("comparison.json",))  # fmt: skip
    if dev == "cpu":
        from opgraph.compare import CPU_PROFILE_NOTE

        notes.append(CPU_PROFILE_NOTE)
        notes.append(
            f"on the CPU the profiler's and recorder's overhead lands in every op's span: the measured device "
            f"time and the compared wall are the profiled run's own ({pc.wall_profiled_us:,.1f} us), so that one "
            f"holds the other; the plain runs took {pc.wall_us:,.1f} us (median of {wall_repeats}), and "
            "wall_time_err in summary.json compares with them"
        )
    for title, columns, rows in comparison_tables(comparison):
        if not (title.startswith("End to end") or title == "By kind"):
            continue
        shown = new_table(title=title, title_justify="left")
        for i, col in enumerate(columns):
            shown.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            shown.add_row(*row)
        console.print(shown)
    print_notes(notes)

    def predicted_and_measured(metric: str) -> tuple[float, float] | None:
        for row in comparison.end_to_end:
            if row.metric == metric and row.reference_us > 0:
                return row.predicted_us, row.reference_us
        return None

    gpu = predicted_and_measured("gpu_time")
    wall = predicted_and_measured("wall_time")
    import torch

    summary = ValidationSummary(
        model=s.model_id,
        device=device,
        device_name=torch.cuda.get_device_name(device) if dev == "cuda" else run.device_name,
        hardware=hw.name,
        settings=dict(s.capture),
        steps=tuple(steps),
        gpu_time_err=gpu[0] / gpu[1] - 1 if gpu else None,
        wall_time_err=wall[0] / pc.wall_us - 1 if wall and pc.wall_us > 0 else None,
        median_op_err=comparison.median_abs_rel_error,
        wall_us=pc.wall_us,
        wall_profiled_us=pc.wall_profiled_us,
        notes=tuple(notes),
        created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
    )
    from opgraph.scenario.folder import SUMMARY_FILE

    (tmp / SUMMARY_FILE).write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return summary


def _same_ops(a: OpGraph, b: OpGraph) -> bool:
    ops = {op.id: op.definition for op in a.ops}
    return len(ops) == len(b.ops) and all(ops.get(op.id) == op.definition for op in b.ops)
