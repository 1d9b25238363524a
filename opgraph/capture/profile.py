"""Capture with profiling: run the model under ``torch.profiler`` with a ``record_function`` range per
recorded op, and attribute every kernel (cuda) or aten CPU op (cpu) to the op id that launched it.

The result holds the graph, a measured :class:`~opgraph.ir.Timeline` (kernels on ``stream N`` tracks,
CPU ops on ``cpu N`` tracks, ``op_id`` set) and the wall time of the same phase with and without the
profiler (the plain runs come first, after a warm-up).

The timeline's spans and its wall time are of one run, so its device time is at most its wall: on
CUDA the wall is the plain runs' median (the profiler's overhead is on the host, kernels keep their
time); on the CPU, where every op's span carries the profiler's and recorder's overhead, it is the
profiled run's own wall, and a note gives the plain runs' wall.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgraph.capture.api import (
    CaptureOptions,
    _metadata_args,
    add_host_timing,
    graph_from_recording,
    prepare,
    run_phase,
    setup_phase,
)
from opgraph.capture.recorder import Recorder
from opgraph.ir.graph import OpGraph, capture_settings
from opgraph.ir.timeline import Span, Timeline, TimelineKind, TimelineSource

_KERNEL_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})


@dataclass(frozen=True)
class ProfiledCapture:
    """A graph and the measured timeline of the same run."""

    graph: OpGraph
    timeline: Timeline
    wall_us: float
    """Wall time of the phase without the profiler or recorder."""
    wall_profiled_us: float
    """Wall time of the phase with the profiler and recorder."""
    trace_file: str | None = None
    """The raw Chrome trace, when kept."""
    wall_runs_us: tuple[float, ...] = ()
    """Every plain run's wall time, in order (``wall_us`` is their median)."""


def _sync(device: str) -> None:
    """Wait for ``device`` (``cuda``, ``cuda:N``) to finish its work; nothing to wait for on the CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def profile_capture(
    model_or_id: Any,
    *,
    keep_trace: str | os.PathLike[str] | None = None,
    wall_repeats: int = 3,
    between_runs: Callable[[], None] | None = None,
    **options: Any,
) -> ProfiledCapture:
    """Capture like :func:`~opgraph.capture.capture` (``device`` cuda, cuda:N or cpu) and profile the same run.

    The plain wall time is the median of ``wall_repeats`` runs after one warm-up run (library
    initialisation, allocator growth and autotuning stay out of it). ``between_runs`` is called
    before each of those runs, outside the timed region: what it times is paired with the runs (a
    shared host's speed drifts within minutes).
    """
    import torch

    opts = CaptureOptions(**options)
    if opts.device == "meta":
        from opgraph.capture.sources import CaptureError

        raise CaptureError("profiling needs real tensors", where="--device", hint="use --device cuda (or cpu)")
    prepared = prepare(model_or_id, opts)
    run_phase(prepared, opts, None)  # warm-up
    walls: list[float] = []
    for _ in range(max(1, wall_repeats)):
        if between_runs is not None:
            between_runs()
        cache = setup_phase(prepared, opts)  # a fresh cache each time, outside the timed region
        _sync(opts.device)
        t0 = time.perf_counter()
        run_phase(prepared, opts, None, cache)
        _sync(opts.device)
        walls.append((time.perf_counter() - t0) * 1e6)
    wall_us = sorted(walls)[len(walls) // 2]

    rec = Recorder(profile_ranges=True)
    rec.add_root(prepared.model)
    acts = [torch.profiler.ProfilerActivity.CPU]
    gpu = opts.device_type == "cuda"
    if gpu:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    cache = setup_phase(prepared, opts)
    _sync(opts.device)
    with torch.profiler.profile(activities=acts, record_shapes=False) as prof:
        t1 = time.perf_counter()
        run_phase(prepared, opts, rec, cache)
        _sync(opts.device)
        wall_prof_us = (time.perf_counter() - t1) * 1e6
    graph, event_op = graph_from_recording(rec, **_metadata_args(prepared, opts))
    graph = add_host_timing(graph, rec, event_op, prepared, opts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        raw = path.read_bytes()
    kept: str | None = None
    if keep_trace is not None:
        kept = str(keep_trace)
        Path(kept).parent.mkdir(parents=True, exist_ok=True)
        Path(kept).write_bytes(gzip.compress(raw) if kept.endswith(".gz") else raw)
    device_name = torch.cuda.get_device_name(opts.device) if gpu else "cpu"
    # A timeline's spans and wall come from one run, so that its device time never exceeds its wall.
    # On CUDA the kernels keep their time under the profiler (its overhead is on the host): the wall
    # is the plain runs' median, what a user's run takes. On the CPU the ops are the device work and
    # the profiler's and recorder's overhead lands in every op's span (small ops several times over):
    # the wall is the profiled run's own, and the plain runs' wall is stated in a note.
    timeline = timeline_from_trace(
        json.loads(raw), graph, event_op, device=device_name, wall_us=wall_us if gpu else wall_prof_us, gpu=gpu
    )
    timeline = timeline.model_copy(update={"notes": (*timeline.notes, _wall_note(gpu, wall_us, wall_prof_us, walls))})
    return ProfiledCapture(graph, timeline, wall_us, wall_prof_us, kept, tuple(walls))


def _wall_note(gpu: bool, wall_us: float, wall_prof_us: float, walls: list[float]) -> str:
    """Which run the timeline's wall is, and the other run's wall."""
    plain = f"{wall_us:.1f} us (median of {len(walls)} plain run{'s' if len(walls) != 1 else ''})"
    if gpu:
        return f"wall time {plain}; with the profiler and recorder: {wall_prof_us:.1f} us"
    return (
        f"CPU profile: the op spans and the wall time ({wall_prof_us:.1f} us) are the profiled run's, so they carry "
        f"the profiler's and recorder's overhead (most on small ops); without them the phase took {plain}"
    )


def timeline_from_trace(
    trace: dict[str, Any],
    graph: OpGraph,
    event_op: list[int | None],
    *,
    device: str = "",
    wall_us: float | None = None,
    gpu: bool = True,
) -> Timeline:
    """Spans of a Chrome trace attributed to graph ops through the ``opgraph_evN`` ranges."""
    events = trace.get("traceEvents", [])
    ranges: dict[Any, list[tuple[float, float, int]]] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("opgraph_ev") and e.get("cat") in ("user_annotation", "cpu_op"):
            try:
                idx = int(name[len("opgraph_ev") :])
            except ValueError:
                continue
            ranges.setdefault(e.get("tid"), []).append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), idx))
    starts: dict[Any, list[float]] = {}
    for tid, lst in ranges.items():
        lst.sort()
        starts[tid] = [r[0] for r in lst]

    def event_at(tid: Any, ts: float) -> int | None:
        lst = ranges.get(tid)
        if not lst:
            return None
        i = bisect.bisect_right(starts[tid], ts) - 1
        if i >= 0 and lst[i][0] <= ts <= lst[i][1]:
            return lst[i][2]
        return None

    launch_event: dict[Any, int] = {}
    if gpu:
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in _RUNTIME_CATS:
                corr = (e.get("args") or {}).get("correlation")
                ev = event_at(e.get("tid"), float(e["ts"]))
                if corr is not None and ev is not None:
                    launch_event[corr] = ev
    by_id = {o.id: o for o in graph.ops}
    spans: list[Span] = []
    origin = min((r[0] for lst in ranges.values() for r in lst), default=0.0)
    unattributed = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        args = e.get("args") or {}
        if gpu and cat in _KERNEL_CATS:
            ev = launch_event.get(args.get("correlation"))
            track = f"stream {args.get('stream', e.get('tid'))}"
        elif not gpu and cat == "cpu_op" and not str(e.get("name", "")).startswith("opgraph_ev"):
            ev = event_at(e.get("tid"), float(e["ts"]))
            track = f"cpu {e.get('tid')}"
        else:
            continue
        op_id = event_op[ev] if ev is not None and ev < len(event_op) else None
        if op_id is None:
            unattributed += 1
        op = by_id.get(op_id) if op_id is not None else None
        spans.append(
            Span(
                name=str(e.get("name", "")),
                track=track,
                start_us=float(e["ts"]) - origin,
                dur_us=max(0.0, float(e.get("dur", 0))),
                op_id=op_id,
                kind=op.kind if op else None,
                category=str(cat),
                layer=op.layer if op else None,
                stage=op.stage if op else None,
                step=op.step if op else None,
                definition=op.definition if op else None,
                args={k: v for k, v in args.items() if isinstance(v, str | int | float | bool)},
            )
        )
    notes = []
    if unattributed:
        notes.append(f"{unattributed} spans ran outside any recorded op (no op_id)")
    return Timeline(
        source=TimelineSource(
            kind=TimelineKind.MEASURED,
            name=graph.metadata.model,
            device=device,
            graph_model=graph.metadata.model,
            config=capture_settings(graph.metadata.capture).flat(),
        ),
        spans=tuple(spans),
        wall_us=wall_us,
        notes=tuple(notes),
    )
