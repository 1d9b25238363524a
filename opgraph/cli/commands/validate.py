"""``opgraph validate MODEL_OR_GRAPH --device cuda -o DIR``: how close is the prediction, on this machine?

One command for the method of ``benchmarks/gpu/accuracy.py`` (issue 18 item 6), through what the
other commands do: capture on meta with host timing (``capture --host-timing``; given a GRAPH,
that graph), replay every unique config on the device (``replay``, the L2 flushed before each
call), time the host issue of the graph's ops in order right before the run (``replay
--issue-only``, CUDA), fit a cost table (``calibrate --issue``), run the real model under the
profiler (``capture --device DEVICE --profile``), simulate the profiled graph with the table (one
in-order stream, eager host) and compare (``compare``). Everything lands in one folder, written
whole or not at all.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import Field

from opgraph.cli.common import check_output_path, console, handle_errors, new_table, print_notes
from opgraph.ir import OpgraphError
from opgraph.ir.tensor import FrozenModel

if TYPE_CHECKING:
    from opgraph.ir import OpGraph

__all__ = ["ValidationStep", "ValidationSummary", "register", "validate"]


class ValidateError(OpgraphError):
    """``validate`` cannot run as asked (no CUDA, a graph whose model cannot be found, ...)."""


class ValidationStep(FrozenModel):
    """One step of a validation: done or skipped (and why), and the files it wrote."""

    name: str
    done: bool
    detail: str = ""
    command: str = ""
    """The CLI command the step stands for."""
    files: tuple[str, ...] = ()
    seconds: float = 0.0


class ValidationSummary(FrozenModel):
    """What ``opgraph validate`` measured and predicted (``summary.json`` of its folder)."""

    model: str
    device: str
    device_name: str = ""
    hardware: str
    settings: dict[str, Any] = Field(default_factory=dict)
    steps: tuple[ValidationStep, ...] = ()
    gpu_time_err: float | None = None
    """Predicted / measured device time - 1."""
    wall_time_err: float | None = None
    """Predicted / measured wall time (without the profiler) - 1."""
    median_op_err: float | None = None
    notes: tuple[str, ...] = ()
    created: str = ""


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
) -> None:
    """Validate the prediction on this machine: replay, calibrate, a profiled run, simulate and compare.

    Prints the end-to-end and per-kind comparison of the calibrated simulation with the measured
    run, and writes the graph, replay results, issue times, calibrated table, profiled graph and
    timeline, simulated timeline, comparison and summary.json into the output folder.
    """
    from opgraph.scenario.folder import check_run_folder, staged_folder

    dev = device.split(":")[0]
    if dev not in ("cuda", "cpu"):
        raise ValidateError(f"unknown device {device!r}", where="--device", hint="cuda, cuda:N or cpu")
    if wall_repeats < 1:
        raise ValidateError(f"{wall_repeats} is out of range", where="--wall-repeats", hint="give 1 or more")
    if not max_time > 0:
        raise ValidateError(f"{max_time} is out of range", where="--max-time", hint="give seconds above 0")
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValidateError("CUDA is not available here", where="--device", hint="use --device cpu for a smoke run")
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
    with staged_folder(output) as tmp:
        summary = _run(tmp, output, graph, model_id, kw, device, hw, warm_l2=warm_l2, check=check,
                       max_time=max_time, wall_repeats=wall_repeats)  # fmt: skip
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


def _run(
    tmp: Path, output: Path, graph: OpGraph, model_id: str, kw: dict[str, Any], device: str, hw: Any, *,
    warm_l2: bool, check: bool, max_time: float, wall_repeats: int,
) -> ValidationSummary:  # fmt: skip
    """Every step into ``tmp`` (the staged folder); prints the tables; returns the summary it wrote."""
    from hardware import TableModel, fit_cost_table
    from opgraph.capture.hosttime import carry_host_gaps
    from opgraph.capture.profile import profile_capture
    from opgraph.cli.commands.calibrate import replay_measurements
    from opgraph.compare import compare_timelines, comparison_tables
    from opgraph.ir import save_graph, save_model, save_timeline
    from opgraph.study import run_study, study_config
    from validators import ReplayOptions, TimingConfig, cost_estimator, run_replay

    dev = device.split(":")[0]
    steps: list[ValidationStep] = []
    notes: list[str] = []
    out = output  # the names the summary and the printed commands use

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
    step("capture", t0, f"opgraph capture {model_id} --host-timing -o {out}/graph.json.gz", ("graph.json.gz",),
         f"{len(graph.ops)} ops" + (", host timed" if host_timed else ""))  # fmt: skip

    # 2. replay every unique config (as `opgraph replay`, the L2 flushed before each call on CUDA)
    t0 = time.perf_counter()
    cold = dev == "cuda" and not warm_l2
    timing = TimingConfig(cold_l2=cold, max_time_s=max_time)
    options = ReplayOptions(timing=timing, check=check)
    run = run_replay([graph], device=device, out=tmp / "replay.jsonl", options=options, estimate=cost_estimator(hw))
    cold_flag = " --cold-l2" if cold else ""
    step("replay", t0, f"opgraph replay {out}/graph.json.gz --device {device}{cold_flag} -o {out}/replay.jsonl",
         ("replay.jsonl",), f"{run.device_name}: {run.coverage.line()}")  # fmt: skip
    if dev != "cuda":
        notes.append("the CPU replay times each op as a whole call (no L2 flush, no kernel timer)")

    # 3. host issue right before the run (CUDA)
    t0 = time.perf_counter()
    issue_us: dict[str, float] = {}
    issue_cmd = f"opgraph replay {out}/graph.json.gz --device {device} --issue-only -o {out}/issue.json"
    if dev == "cuda":
        from validators.runner import time_issue

        issue_opts = ReplayOptions(check=False, energy=False, sm_clock=False, timing=timing)
        seq = time_issue([graph], device=device, out=tmp / "issue.json", options=issue_opts)
        issue_us = seq.us_by_key
        step("issue", t0, issue_cmd, ("issue.json",), f"{len(issue_us)} configs issued in the graph's order")
    else:
        reason = "issue timing needs CUDA (on a CPU a call runs the whole op): the replay's host times are used"
        steps.append(ValidationStep(name="issue", done=False, detail=reason, command=issue_cmd))
        console.print(f"[bold]issue[/bold]: skipped ({reason})")

    # 4. calibrate (as `opgraph calibrate --issue`)
    t0 = time.perf_counter()
    measurements, _devices, from_issue, total = replay_measurements([tmp / "replay.jsonl"], issue_us)
    if not measurements:
        raise ValidateError(
            f"none of the {total} replay results has a usable timing", where=str(tmp / "replay.jsonl"),
            hint="see replay.jsonl's statuses (unsupported ops carry no time)",
        )  # fmt: skip
    table = fit_cost_table(measurements, hw, source={"replays": "replay.jsonl", "validate": model_id})
    table.save(tmp / "calibrated.json")
    issue_arg = f" --issue {out}/issue.json" if issue_us else ""
    fitted = f"{len(measurements)} configs" + (f", {from_issue} issue times" if issue_us else "")
    step("calibrate", t0, f"opgraph calibrate {out}/replay.jsonl{issue_arg} -H {hw.name} -o {out}/calibrated.json",
         ("calibrated.json",), fitted)  # fmt: skip

    # 5. the real model under the profiler
    t0 = time.perf_counter()
    pc = profile_capture(model_id, device=device, wall_repeats=wall_repeats, **kw)
    # The profiled graph is the replayed one op for op: it takes the host gaps timed on meta, so that
    # simulating the saved file (the command printed below) gives the same prediction.
    carried = host_timed and _same_ops(graph, pc.graph)
    sim_graph = carry_host_gaps(graph, pc.graph) if carried else pc.graph
    save_graph(sim_graph, tmp / "profiled.graph.json.gz")
    measured = pc.timeline.model_copy(update={"wall_us": pc.wall_us})
    if dev == "cpu":
        from opgraph.compare import CPU_PROFILE_NOTE, cpu_device_view

        measured = cpu_device_view(measured)
        notes.append(CPU_PROFILE_NOTE)
    save_timeline(measured, tmp / "measured.timeline.json.gz")
    routing = [a for a in pc.graph.metadata.assumptions if "MoE routing is modelled" in a]
    if host_timed and not carried:
        notes.append("the profiled graph differs from the replayed one op for op: its host gaps are not the meta's")
    if routing:
        notes.append("the profiled run is not the unmodified model: capture replaces its MoE routing (" + routing[0]
                     + "); issue 18 item 5 asks for the model's own routing")  # fmt: skip
    step("profile", t0, f"opgraph capture {model_id} --device {device} --profile -o {out}/profiled.graph.json.gz "
         f"--timeline {out}/measured.timeline.json.gz", ("profiled.graph.json.gz", "measured.timeline.json.gz"),
         f"wall {pc.wall_us:,.1f} us (median of {wall_repeats}), {len(measured.spans)} spans")  # fmt: skip

    # 6. simulate the profiled graph with the table (one in-order stream, eager host)
    t0 = time.perf_counter()
    config = study_config(1, policy="stream", skip_uncosted=True)
    study = run_study(sim_graph, table.hardware or hw, TableModel(table), config)
    simulated = study.result.timeline()
    save_timeline(simulated, tmp / "simulated.timeline.json.gz")
    uncosted = study.result.stats().uncosted
    if uncosted:
        notes.append(f"{len(uncosted)} op(s) the table could not cost were simulated as free")
    step("simulate", t0, f"opgraph simulate {out}/profiled.graph.json.gz -H {out}/calibrated.json -c "
         f"{out}/calibrated.json --policy stream --skip-uncosted -o {out}/simulated.timeline.json.gz",
         ("simulated.timeline.json.gz",), f"makespan {study.result.stats().makespan_us:,.1f} us")  # fmt: skip

    # 7. compare
    t0 = time.perf_counter()
    comparison = compare_timelines(simulated, measured, graph=pc.graph)
    save_model(comparison, tmp / "comparison.json")
    step("compare", t0, f"opgraph compare {out}/simulated.timeline.json.gz {out}/measured.timeline.json.gz "
         f"--graph {out}/profiled.graph.json.gz", ("comparison.json",))  # fmt: skip
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

    def err(metric: str) -> float | None:
        for row in comparison.end_to_end:
            if row.metric == metric and row.reference_us > 0:
                return row.predicted_us / row.reference_us - 1
        return None

    import torch

    summary = ValidationSummary(
        model=model_id,
        device=device,
        device_name=torch.cuda.get_device_name() if dev == "cuda" else run.device_name,
        hardware=hw.name,
        settings=kw,
        steps=tuple(steps),
        gpu_time_err=err("gpu_time"),
        wall_time_err=err("wall_time"),
        median_op_err=comparison.median_abs_rel_error,
        notes=tuple(notes),
        created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
    )
    from opgraph.scenario.folder import SUMMARY_FILE

    (tmp / SUMMARY_FILE).write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return summary


def _same_ops(a: OpGraph, b: OpGraph) -> bool:
    ops = {op.id: op.definition for op in a.ops}
    return len(ops) == len(b.ops) and all(ops.get(op.id) == op.definition for op in b.ops)
