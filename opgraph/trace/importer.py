"""Import of Kineto/torch-profiler Chrome traces into linked :class:`TraceData` and measured ``Timeline``s.

Device activity (kernels, memcpy, memset) becomes spans on ``gpu<device>/stream<id>`` tracks; host
activity (CPU ops, runtime launches, user annotations, and the ``nn.Module`` events of a trace recorded
``with_stack=True``, which scope module calls; other Python events are left out) spans on ``cpu/<thread>``
tracks; GPU-side user annotations on ``gpu<device>/annotations``. Kernels are linked to the runtime call
that launched them by correlation id (or, lacking it, through the ``ac2g`` flow events) and to the innermost CPU op by
External id. Known quirks are tolerated and reported in ``Timeline.notes``.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

from opgraph.ir.gcpause import paused_gc
from opgraph.ir.graph import Scalar
from opgraph.ir.ops import OpKind, Stage
from opgraph.ir.timeline import Bound, KernelType, Span, SpanCategory, Timeline, TimelineKind, span_factory
from opgraph.trace.events import GPU_KINDS, HOST_KINDS, MODULE_EVENT_PREFIX, GpuEvent, HostEvent, TraceData
from opgraph.trace.patterns import core_name
from opgraph.trace.reader import NoTraceEventsError, TraceFile, TraceFormatError, discover, read_trace
from opgraph.trace.window import WINDOW_ARG, WINDOW_PHRASE, window_leftovers, window_note

_KINETO_CATS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "memcpy",
    "memset",
    "cpu_op",
    "operator",
    "cuda_runtime",
    "cuda_driver",
    "runtime",
    "hip_runtime",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
)
"""Event ``cat`` values imported (Kineto's, and the spellings older or AMD traces use)."""
_GPU_CATS = {c: SpanCategory.parse(c) for c in _KINETO_CATS if SpanCategory.parse(c).is_device}
_HOST_CATS = {c: SpanCategory.parse(c) for c in _KINETO_CATS if not SpanCategory.parse(c).is_device}
_LAUNCH_WORDS = ("LaunchKernel", "LaunchCooperativeKernel", "GraphLaunch", "ModuleLaunchKernel", "ExtLaunch")


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return None


def _dim3(v: Any) -> str | None:
    if type(v) is list and v:
        return ",".join(map(str, v))
    return None


def _loose_json(value: Any, key: str, notes: list[str]) -> Any:
    """A metadata value that may be an object, a JSON string, or a Python-repr string with single quotes."""
    if not isinstance(value, str):
        return value
    try:
        out = json.loads(value)
        notes.append(f"{key} was a JSON string instead of an object; parsed")
        return out
    except ValueError:
        pass
    try:
        out = ast.literal_eval(value)
        notes.append(f"{key} was a Python-repr string (single quotes) instead of JSON; parsed")
        return out
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        notes.append(f"{key} is an unparseable string; ignored")
        return None


def collect(file: TraceFile, *, python: bool = False, modules: bool = True) -> TraceData:
    """Read one trace file into linked :class:`TraceData` (events sorted by start; times from 0).

    ``python`` keeps every ``python_function`` event (the Python call stack of ``with_stack=True``);
    otherwise only ``modules`` keeps the ``nn.Module: ...`` ones (:data:`MODULE_EVENT_PREFIX`), the module
    scopes the classifier reads (an MoE experts module around its per-expert GEMMs). They are few: one per
    module call, against every Python function call."""
    # Cyclic GC passes over millions of freshly decoded dicts cost more than the parse itself;
    # nothing decoded here forms cycles, so collection is paused while importing.
    with paused_gc():
        return _collect(file, python, modules)


def _collect(file: TraceFile, python: bool, modules: bool) -> TraceData:
    stream = read_trace(file)
    data = TraceData(file=file.name)
    gpu: list[GpuEvent] = []
    host: list[HostEvent] = []
    flow_start: dict[int, tuple[Any, float]] = {}
    flow_end: dict[tuple[Any, float], int] = {}
    missing: dict[str, int] = {}
    first_missing = ""
    total = 0
    bad_dur = 0
    skipped_python = 0
    gpu_cats = _GPU_CATS
    host_cats = _HOST_CATS
    gpu_append = gpu.append
    host_append = host.append
    for ev in stream:
        total += 1
        ph = ev.get("ph")
        ts = ev.get("ts")  # complete events and flow ends both need it
        if type(ts) is not float:
            ts = _num(ts)
        if ph == "X":
            cat = ev.get("cat")
            gkind = gpu_cats.get(cat)  # type: ignore[arg-type]
            hkind = None
            if gkind is None:
                hkind = host_cats.get(cat)  # type: ignore[arg-type]
                if hkind is None:
                    if not isinstance(cat, str) or cat == cat.lower():
                        continue
                    cat = cat.lower()
                    gkind = gpu_cats.get(cat)
                    hkind = None if gkind else host_cats.get(cat)
                    if gkind is None and hkind is None:
                        continue
            name = ev.get("name")
            if (
                hkind is SpanCategory.PYTHON
                and not python
                and not (modules and type(name) is str and name.startswith(MODULE_EVENT_PREFIX))
            ):
                skipped_python += 1
                continue
            dur = ev.get("dur")
            if type(dur) is not float:
                dur = _num(dur)
            if type(name) is not str or ts is None or dur is None:
                field = "name" if not isinstance(name, str) else ("ts" if ts is None else "dur")
                missing[field] = missing.get(field, 0) + 1
                if not first_missing:
                    first_missing = f"event #{total - 1} ({cat}) has no valid '{field}'"
                continue
            if dur < 0:
                bad_dur += 1
                continue
            args = ev.get("args")
            if type(args) is not dict:
                args = {}
            if gkind is not None:
                dev = args.get("device")
                if type(dev) is not int:
                    dev = _int(dev)
                    if dev is None:
                        dev = _int(ev.get("pid")) or 0
                strm = args.get("stream")
                if type(strm) is not int:
                    strm = _int(strm)
                    if strm is None:
                        strm = _int(ev.get("tid")) or 0
                corr = args.get("correlation")
                ext = args.get("External id")
                nbytes = args.get("bytes")
                gpu_append(
                    GpuEvent(
                        name,
                        gkind,
                        ts,
                        dur,
                        dev,
                        strm,
                        corr if type(corr) is int else _int(corr),
                        ext if type(ext) is int else _int(ext),
                        _dim3(args.get("grid")),
                        _dim3(args.get("block")),
                        nbytes if type(nbytes) is int else (None if nbytes is None else _int(nbytes)),
                    )
                )
                if "op_id" in args:  # a trace opgraph exported: keep its op attribution
                    gpu[-1].ours = {k: args[k] for k in _OURS if k in args}
            else:
                corr = args.get("correlation")
                ext = args.get("External id")
                host_append(
                    HostEvent(
                        name,
                        hkind,  # type: ignore[arg-type]
                        ts,
                        dur,
                        ev.get("pid", 0),
                        ev.get("tid", 0),
                        ext if type(ext) is int else _int(ext),
                        corr if type(corr) is int else _int(corr),
                        args.get("Input Dims") if hkind is SpanCategory.CPU_OP else None,
                    )
                )
        elif ph == "s" or ph == "f":
            if ev.get("cat") != "ac2g":
                continue
            fid = ev.get("id")
            if type(fid) is not int:
                fid = _int(fid)
            if fid is None or ts is None:
                continue
            if ph == "s":
                flow_start[fid] = (ev.get("tid"), ts)
            else:
                flow_end[(ev.get("tid"), ts)] = fid
    data.events_total = total
    _metadata(data, stream.meta, stream.array_format)
    if stream.file.rank_hint is not None and data.rank is None:
        data.rank = stream.file.rank_hint
    if missing:
        what = ", ".join(f"{n} without '{k}'" for k, n in sorted(missing.items()))
        data.incomplete.append(
            f"skipped {sum(missing.values())} events missing fields ({what}; first: {first_missing})"
        )
    if bad_dur:
        data.incomplete.append(f"skipped {bad_dur} events with a negative duration")
    if skipped_python:
        data.notes.append(
            f"{skipped_python} python_function events {'other than nn.Module scopes ' if modules else ''}not "
            "imported (the Python API's opgraph.trace.load_trace_data(path, python=True) keeps them)"
        )
    _link(data, gpu, host, flow_start, flow_end)
    gpu.sort(key=lambda e: e.ts)
    host.sort(key=lambda e: e.ts)
    origin = min(gpu[0].ts if gpu else float("inf"), host[0].ts if host else float("inf"))
    if origin == float("inf"):
        origin = 0.0
    for g in gpu:
        g.ts -= origin
        if g.launch_ts is not None:
            g.launch_ts -= origin
    for h in host:
        h.ts -= origin
    data.origin_us = origin
    data.gpu, data.host = gpu, host
    _describe(data)
    return data


def _metadata(data: TraceData, meta: dict[str, Any], array_format: bool) -> None:
    notes = data.notes
    if array_format:
        notes.append("bare JSON array of events: no deviceProperties or distributedInfo metadata")
        return
    props = _loose_json(meta.get("deviceProperties"), "deviceProperties", notes)
    if isinstance(props, dict):
        props = [props]
    if isinstance(props, list):
        data.device_props = [p for p in props if isinstance(p, dict)]
    dist = _loose_json(meta.get("distributedInfo"), "distributedInfo", notes)
    if isinstance(dist, dict):
        data.rank = _int(dist.get("rank"))
        data.world_size = _int(dist.get("world_size"))
    base = _int(meta.get("baseTimeNanoseconds"))
    data.base_time_ns = base
    for key in ("schemaVersion", "cuda_runtime_version", "hip_runtime_version", "cupti_version", "roctracer_version"):
        v = meta.get(key)
        if isinstance(v, (int, float, str)) and not isinstance(v, bool):
            data.meta[key] = v
    data.runtime = "hip" if ("hip_runtime_version" in meta or "roctracer_version" in meta) else ""


def _link(
    data: TraceData,
    gpu: list[GpuEvent],
    host: list[HostEvent],
    flow_start: dict[int, tuple[Any, float]],
    flow_end: dict[tuple[Any, float], int],
) -> None:
    runtime: dict[int, HostEvent] = {}
    runtime_at: dict[tuple[Any, float], HostEvent] = {}
    ops: dict[int, HostEvent] = {}
    hip = cuda = 0
    for h in host:
        if h.kind == "runtime":
            if h.correlation is not None:
                runtime[h.correlation] = h
            runtime_at[(h.tid, h.ts)] = h
            if h.name.startswith("hip"):
                hip += 1
            elif h.name.startswith(("cuda", "cu")):
                cuda += 1
        elif h.kind == "cpu_op" and h.external_id is not None:
            ops[h.external_id] = h
    if not data.runtime:
        data.runtime = "hip" if hip > cuda else ("cuda" if cuda else "")
    by_thread: dict[Any, tuple[list[float], list[HostEvent]]] = {}
    cpu_ops = sorted((h for h in host if h.kind == "cpu_op"), key=lambda h: (h.ts, -h.dur))
    for h in cpu_ops:
        entry = by_thread.setdefault(h.tid, ([], []))
        entry[0].append(h.ts)
        entry[1].append(h)
    for _, thread_ops in by_thread.values():
        _nest(thread_ops)
    stacks: dict[int, tuple[str, ...]] = {}
    linked = via_flow = 0
    kernels = 0
    for g in gpu:
        if g.kind == "kernel":
            kernels += 1
        r = runtime.get(g.correlation) if g.correlation is not None else None
        if r is None and flow_end:
            fid = flow_end.get((g.stream, g.ts))
            start = flow_start.get(fid) if fid is not None else None
            if start is not None:
                r = runtime_at.get(start)
                if r is not None:
                    via_flow += 1
        if r is not None:
            g.launch_ts = r.ts
            g.launch_name = r.name
            linked += 1
            ext = g.external_id if g.external_id is not None else r.external_id
        else:
            ext = g.external_id
        op = ops.get(ext) if ext is not None else None
        if op is None and r is not None:
            op = _enclosing(by_thread, r)
        if op is not None:
            g.launch_op = op.name
            g.launch_dims = op.input_dims
            g.launch_host = op
            stack = stacks.get(id(op))
            if stack is None:
                names = []
                up: HostEvent | None = op
                while up is not None:
                    names.append(up.name)
                    up = up.parent
                stack = stacks[id(op)] = tuple(names)
            g.launch_stack = stack
    if gpu and not host:
        data.notes.append("no host events: kernels cannot be linked to CPU ops or launches")
    elif kernels and linked == 0:
        data.notes.append("no kernel could be linked to a runtime launch (no correlation ids or flow events)")
    elif kernels and linked < len(gpu):
        data.notes.append(f"{len(gpu) - linked} of {len(gpu)} device events not linked to a runtime launch")
    if via_flow:
        data.notes.append(f"{via_flow} device events linked through ac2g flow events (no correlation arg)")


def _nest(ops: list[HostEvent]) -> None:
    """Set each CPU op's ``parent``: the innermost op of the same thread that contains it (``ops`` sorted by
    start, longer first on ties)."""
    open_ops: list[HostEvent] = []
    for h in ops:
        while open_ops and open_ops[-1].ts + open_ops[-1].dur < h.ts + h.dur - 1e-6:
            if open_ops[-1].ts + open_ops[-1].dur <= h.ts:
                open_ops.pop()
            else:  # partial overlap: not nested; leave it open for the ops it does contain
                break
        if open_ops and open_ops[-1].ts + open_ops[-1].dur >= h.ts + h.dur - 1e-6:
            h.parent = open_ops[-1]
        open_ops.append(h)


def _enclosing(by_thread: dict[Any, tuple[list[float], list[HostEvent]]], r: HostEvent) -> HostEvent | None:
    """The innermost CPU op on the runtime call's thread whose interval contains the call."""
    entry = by_thread.get(r.tid)
    if entry is None:
        return None
    starts, ops = entry
    i = bisect.bisect_right(starts, r.ts) - 1
    for j in range(i, max(i - 64, -1), -1):
        op = ops[j]
        if op.ts + op.dur >= r.ts:
            return op
    return None


def _describe(data: TraceData) -> None:
    notes = data.notes
    props = data.device_props
    if not props:
        notes.append("no deviceProperties: device name unknown")
    else:
        devs = sorted({g.device for g in data.gpu})
        prop = next((p for p in props if _int(p.get("id")) in devs), props[0])
        name = str(prop.get("name") or "").strip()
        if not name:
            vendor = "AMD GPU" if data.runtime == "hip" or _int(prop.get("warpSize")) == 64 else "GPU"
            cc = f"{prop.get('computeMajor', '?')}.{prop.get('computeMinor', '?')}"
            sms = prop.get("numSms")
            unit = "CUs" if vendor == "AMD GPU" else "SMs"
            name = f"{vendor} (compute {cc}, {sms} {unit})" if sms else f"{vendor} (compute {cc})"
            notes.append(f"empty device name in deviceProperties; reported as {name!r}")
        data.device_name = name
    if not data.gpu:
        notes.append("no GPU kernels, memcpy or memset events: the file holds host activity only")
    elif not any(g.kind == "kernel" for g in data.gpu):
        notes.append("no GPU kernel events (only memcpy/memset)")
    if not any(h.kind == "cpu_op" for h in data.host):
        notes.append("no CPU op events: no launch ops or input shapes")
    elif not any(h.input_dims for h in data.host if h.kind == "cpu_op"):
        notes.append("no input shapes (record_shapes was off): stages cannot be read from attention shapes")


def collect_all(path: str | Path, *, python: bool = False, modules: bool = True) -> list[TraceData]:
    """Every rank at ``path`` (a file, a folder of ranks, or a ``.tar.gz``), each linked, sorted by rank
    (``python`` and ``modules``: which Python events to keep, as in :func:`collect`)."""
    files = discover(path)
    out: list[TraceData] = []
    skipped: list[str] = []
    for f in files:
        try:
            out.append(collect(f, python=python, modules=modules))
        except NoTraceEventsError:
            if len(files) == 1:
                raise
            skipped.append(Path(f.name).name)
    if not out:
        raise TraceFormatError(
            "no file in it holds a traceEvents array", where=str(path), hint="point at torch-profiler trace files"
        )
    if skipped:
        for d in out:
            d.notes.append(f"skipped {len(skipped)} JSON file(s) without traceEvents: {', '.join(skipped[:4])}")
    if len(out) > 1:
        for i, d in enumerate(out):
            if d.rank is None:
                d.rank = i
        ranks = [d.rank for d in out]
        if len(set(ranks)) != len(ranks):
            for i, d in enumerate(out):
                d.notes.append(f"duplicate rank ids {ranks}; rank taken from file order ({i})")
                d.rank = i
        out.sort(key=lambda d: d.rank if d.rank is not None else 0)
    return out


_STAGE_VALUES = ("prefill", "decode")
_STACK_SEP = " <- "
"""Joins a kernel's launching CPU ops (innermost first) in a timeline span's ``launch_stack`` arg."""
_OURS = ("op_id", "definition", "layer", "stage", "step", "bound")
"""Span fields opgraph's exporter writes into a kernel's args, read back on import."""


_make_span = span_factory()
"""Spans from the validated stream, without validating each again (:func:`opgraph.ir.timeline.span_factory`)."""
_JSON = json.JSONEncoder(separators=(",", ":")).encode
"""Compact JSON (one encoder for all spans: ``json.dumps`` builds one per call)."""
_NUMERIC_LISTS = re.compile(r"[\[\],0-9.e+\-]*")


def _dims_json(dims: Any) -> str:
    """Compact JSON of a shape list: its repr without spaces when that is nested lists of numbers (the
    same text, several times faster than the encoder), else the JSON encoder's."""
    text = repr(dims).replace(" ", "")
    return text if _NUMERIC_LISTS.fullmatch(text) else _JSON(dims)


_CATEGORY = {c.value: c for c in SpanCategory}
_DIMS_TYPES = frozenset({"attention", "gemm", "moe"})
"""Kernel types whose launching op's input shapes a span keeps (``launch_dims``): attention's give the query
length (the stage), GEMMs' their (n, k) (an eager per-expert MoE loop), when the timeline is analyzed again."""
_STAGE = {v: Stage(v) for v in _STAGE_VALUES}


def to_timeline(
    data: TraceData,
    *,
    cpu: bool = True,
    labels: Sequence[tuple[int | None, str | None, int | None]] | None = None,
    track_prefix: str = "",
    offset_us: float = 0.0,
) -> Timeline:
    """A measured ``Timeline`` of ``data``: device spans (with ``labels`` (layer, stage, pass) per device
    event when given by the analyzer) and, with ``cpu``, host spans.

    Device events at the start that ran work launched before the profiler window opened
    (:func:`~opgraph.trace.window.window_leftovers`, which the analysis and ``opgraph compare`` leave out)
    carry the arg ``launched_before_window: true``, and a note says how many.

    The spans are built unchecked (:func:`opgraph.ir.timeline.span_factory`): every field comes from the already
    validated import, so validating each of a few hundred thousand spans again would only repeat those
    checks at a large share of the import's cost."""
    make = _make_span
    category = _CATEGORY
    opkind_of_type = OP_KIND_OF_TYPE
    opkind = op_kind
    moe = KernelType.MOE
    stages = _STAGE
    kernel = SpanCategory.KERNEL
    gpu_tracks: dict[tuple[int, int], str] = {}
    host_tracks: dict[tuple[SpanCategory, int | str, int | str], str] = {}
    spans: list[Span] = []
    skip = window_leftovers(data.gpu, data.host)
    for i, g in enumerate(data.gpu):
        args: dict[str, Scalar] = {"type": g.kind.value, "device": g.device, "stream": g.stream}
        if i < skip:
            args[WINDOW_ARG] = True
        if g.correlation is not None:
            args["correlation"] = g.correlation
        if g.external_id is not None:
            args["external_id"] = g.external_id
        if g.grid is not None:
            args["grid"] = g.grid
        if g.block is not None:
            args["block"] = g.block
        if g.nbytes is not None:
            args["bytes"] = g.nbytes
        if g.launch_ts is not None:
            args["launch_us"] = g.launch_ts + offset_us
            args["launch"] = g.launch_name
        if g.launch_op is not None:
            args["launch_op"] = g.launch_op
            if len(g.launch_stack) > 1:
                args["launch_stack"] = _STACK_SEP.join(g.launch_stack)
            if g.launch_dims and g.ktype in _DIMS_TYPES:
                args["launch_dims"] = _dims_json(g.launch_dims)
        tkey = (g.device, g.stream)
        track = gpu_tracks.get(tkey)
        if track is None:
            track = gpu_tracks[tkey] = f"{track_prefix}gpu{g.device}/stream{g.stream}"
        layer = step = stage_member = None
        if labels is not None:
            layer, stage, step = labels[i]
            stage_member = stages.get(stage) if stage is not None else None
            if stage is not None and stage_member is None:
                args["stage"] = stage
        ktype = g.ktype
        span: dict[str, Any] = {
            "name": g.name,
            "track": track,
            "start_us": g.ts + offset_us,
            "dur_us": g.dur,
            "op_id": None,
            "kind": opkind(g) if ktype is moe else opkind_of_type.get(ktype),
            "category": category[ktype.value if g.kind is kernel else g.kind.value],
            "layer": layer,
            "stage": stage_member,
            "step": step,
            "definition": None,
            "bound": None,
            "args": args,
        }
        if g.ours:  # our own export: its attribution wins over the analyzer's guesses
            for key, value in g.ours.items():
                if key == "stage" and value not in _STAGE_VALUES:
                    continue
                if key in ("op_id", "layer", "step") and type(value) is not int:
                    continue
                if key in ("definition", "bound") and not isinstance(value, str):
                    continue
                if key == "stage":
                    value = _STAGE[value]
                elif key == "bound":
                    try:
                        value = Bound(value)
                    except ValueError:
                        continue
                span[key] = value
        spans.append(make(span))
    if cpu:
        for h in data.host:
            hargs: dict[str, Scalar] = {"type": h.kind.value}
            if h.external_id is not None:
                hargs["external_id"] = h.external_id
            if h.correlation is not None:
                hargs["correlation"] = h.correlation
            if h.input_dims:
                hargs["input_dims"] = _dims_json(h.input_dims)
            hkey = (h.kind, h.pid, h.tid)
            track = host_tracks.get(hkey)
            if track is None:
                if h.kind == "gpu_annotation":
                    track = f"{track_prefix}gpu{h.pid}/annotations"
                else:
                    track = f"{track_prefix}cpu/{h.tid}"
                host_tracks[hkey] = track
            spans.append(
                make(
                    {
                        "name": h.name,
                        "track": track,
                        "start_us": h.ts + offset_us,
                        "dur_us": h.dur,
                        "op_id": None,
                        "kind": None,
                        "category": category[h.kind.value],
                        "layer": None,
                        "stage": None,
                        "step": None,
                        "definition": None,
                        "bound": None,
                        "args": hargs,
                    }
                )
            )
    spans.sort(key=_span_order)
    config: dict[str, Any] = {"origin_us": data.origin_us, "events": data.events_total}
    if data.rank is not None:
        config["rank"] = data.rank
    if data.world_size is not None:
        config["world_size"] = data.world_size
    if data.runtime:
        config["runtime"] = data.runtime
    if data.base_time_ns is not None:
        config["base_time_ns"] = data.base_time_ns
    config.update(data.meta)
    notes = list(data.notes)
    if skip:
        notes.append(
            window_note(
                data.gpu,
                skip,
                f"their spans carry the arg {WINDOW_ARG}=true and no pass, layer or stage; `opgraph analyze` "
                "and `opgraph compare` leave them out of every total",
            )
        )
    notes += [f"incomplete: {r}" for r in data.incomplete]
    if not cpu:
        notes.append("host events left out (kernels only)")
    return Timeline.model_validate(
        {
            "source": {
                "kind": TimelineKind.MEASURED,
                "name": Path(data.file.split(":")[-1]).name,
                "device": data.device_name,
                "trace_file": data.file,
                "config": config,
            },
            "spans": spans,  # Span instances: pydantic takes them as they are
            "notes": notes,
        }
    )


_span_order = attrgetter("start_us", "track")


OP_KIND_OF_TYPE: dict[str, OpKind] = {
    k: OpKind(v)
    for k, v in {
        "attention": "attention",
        "gemm": "gemm",
        "norm": "norm",
        "activation": "activation",
        "rope": "rope",
        "elementwise": "elementwise",
        "reduction": "reduction",
        "memory": "memory",
        "communication": "collective",
        "sampling": "topk",
        "embedding": "embedding",
        "moe": "moe_routing",
        "quantization": "elementwise",
        "other": "other",
        "unknown": "other",
    }.items()
}
"""Kernel type of a device event -> the op kind its span takes, for every kernel type (``other`` where the
IR has no such kind). A graph's ``TopK`` op covers sampling (argmax, multinomial), so ``sampling`` kernels
take its ``topk`` kind. ``moe`` kernels take ``moe_routing`` here, except the expert GEMMs among them, which
take ``gemm`` (:func:`op_kind`), as a graph lowers an MoE block into ``MoeRouting`` ops (router top-k,
dispatch, combine) and expert ``Gemm`` ops."""

_EXPERT_GEMM_NAME = re.compile(
    r"gemm|matmul|nvjet|cutlass|cublas|xmma|fused_moe_kernel|fmoe|ck_moe_stage|fused_experts|gate_up_proj"
    r"|(^|[^a-z])b?mm([^a-z]|$)",
    re.IGNORECASE,
)
"""Names of MoE kernels that run the experts' GEMMs (vLLM's ``fused_moe_kernel``, ``_matmul_ogs``, grouped
GEMMs, AITER's ``fmoe``, CK's MoE stages, trtllm-gen's ``bmm_``), unless :data:`_ROUTING_NAME` matches too."""
_ROUTING_NAME = re.compile(
    r"topk|sort|histogram|align|finalize|scatter|gather|routing|permute|shuffle|count|softmax|memset|pad|prepare"
    r"|moe_sum|fused_gate",
    re.IGNORECASE,
)
"""Names of MoE kernels that route, dispatch or combine tokens (``_finalize_matmul_scatter``,
``moe_align_block_size``, the router's top-k), whatever GEMM word they hold."""


def is_expert_gemm(g: GpuEvent) -> bool:
    """An MoE kernel (``g.ktype`` is ``moe``) that runs expert GEMMs: launched by a matmul CPU op
    (``aten::_grouped_mm``, ``aten::bmm`` over gathered expert weights, an eager loop's ``aten::mm``), or,
    without CPU ops, named as a GEMM and not as routing (:data:`_EXPERT_GEMM_NAME`)."""
    if g.launched_by_matmul:
        return True
    core = core_name(g.name)
    return _EXPERT_GEMM_NAME.search(core) is not None and _ROUTING_NAME.search(core) is None


def op_kind(g: GpuEvent) -> OpKind | None:
    """The op kind of a device event's span (:data:`OP_KIND_OF_TYPE`; an expert GEMM is ``gemm``).

    >>> def moe(name: str) -> GpuEvent:
    ...     return GpuEvent(name, SpanCategory.KERNEL, 0.0, 1.0, 0, 7, ktype=KernelType.MOE)
    >>> op_kind(moe("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu")).value
    'gemm'
    >>> op_kind(moe("_finalize_matmul_scatter_bf16")).value
    'moe_routing'

    """
    if g.ktype is KernelType.MOE and is_expert_gemm(g):
        return OpKind.GEMM
    return OP_KIND_OF_TYPE.get(g.ktype)


def from_timeline(tl: Timeline, *, link: bool = False, cpu_ops: bool = True) -> TraceData:
    """Rebuild :class:`TraceData` from a measured ``Timeline`` (as written by :func:`to_timeline`, or any
    timeline whose device spans sit on ``gpu*`` tracks). ``link`` rebuilds each kernel's launching CPU op
    (``launch_host``, with its parents and input dims) from the host spans, as attribution and comparison
    need; the analysis needs only the op names the spans carry. Without ``cpu_ops`` (and ``link``) only
    the host spans the analysis reads are kept: annotations (steps), CUDA-graph launches (the start
    of graph replays) and ``nn.Module`` Python events (module scopes)."""
    data = TraceData(file=tl.source.trace_file or tl.source.name or "timeline")
    data.device_name = tl.source.device
    # the note on window leftovers is the import's; the analysis finds them again and says so in its own words
    data.notes = [n for n in tl.notes if not n.startswith("incomplete: ") and WINDOW_PHRASE not in n]
    data.incomplete = [n[len("incomplete: ") :] for n in tl.notes if n.startswith("incomplete: ")]
    cfg = tl.source.config
    rank = cfg.get("rank")
    data.rank = rank if isinstance(rank, int) else None
    gpu_kinds = _GPU_KIND_OF
    all_host = cpu_ops or link
    host_kinds = _HOST_KIND_OF if all_host else _ANALYSIS_HOST_KIND_OF
    runtime = SpanCategory.RUNTIME
    python = SpanCategory.PYTHON
    gpu_track: dict[str, bool] = {}
    gpu_append = data.gpu.append
    host_append = data.host.append
    for s in tl.spans:
        a = s.args
        typ = a.get("type")
        kind = gpu_kinds.get(typ) if type(typ) is str else None
        if kind is None and typ is None:
            on_gpu = gpu_track.get(s.track)
            if on_gpu is None:
                on_gpu = gpu_track[s.track] = "gpu" in s.track.split("/")[0] and not s.track.endswith("/annotations")
            if on_gpu or (s.category is not None and SpanCategory(s.category).is_device):
                kind = SpanCategory.KERNEL
        if kind is not None:
            dev = a.get("device")
            st = a.get("stream")
            launch = a.get("launch_us")
            grid = a.get("grid")
            block = a.get("block")
            lname = a.get("launch")
            op = a.get("launch_op")
            dims = a.get("launch_dims")
            ev = GpuEvent(
                s.name,
                kind,
                s.start_us,
                s.dur_us,
                dev if type(dev) is int else 0,
                st if type(st) is int else _track_stream(s.track),
                _id(a.get("correlation")),
                _id(a.get("external_id")),
                grid if type(grid) is str else None,
                block if type(block) is str else None,
                _id(a.get("bytes")),
                float(launch) if isinstance(launch, (int, float)) else None,
                lname if type(lname) is str else None,
                op if type(op) is str else None,
                json.loads(dims) if type(dims) is str else None,
            )
            stack = a.get("launch_stack")
            if type(stack) is str:
                ev.launch_stack = tuple(stack.split(_STACK_SEP))
            elif ev.launch_op:
                ev.launch_stack = (ev.launch_op,)
            gpu_append(ev)
        else:
            hkind = host_kinds.get(typ) if type(typ) is str else None
            if hkind is not None and (
                all_host
                or (hkind is not runtime and hkind is not python)
                or (hkind is runtime and "GraphLaunch" in s.name)
                or (hkind is python and s.name.startswith(MODULE_EVENT_PREFIX))
            ):
                dims = a.get("input_dims")
                host_append(
                    HostEvent(
                        s.name,
                        hkind,
                        s.start_us,
                        s.dur_us,
                        0,
                        s.track,
                        _id(a.get("external_id")),
                        _id(a.get("correlation")),
                        json.loads(dims) if link and type(dims) is str else None,  # shapes matter to links only
                    )
                )
    if link and data.gpu and data.host:
        # rebuild the launch links (launching CPU op, its stack and input dims) from the host spans
        notes = data.notes
        data.notes = []
        _link(data, data.gpu, data.host, {}, {})
        data.notes = notes
    return data


_GPU_KIND_OF = {k.value: k for k in GPU_KINDS}
_HOST_KIND_OF = {k.value: k for k in HOST_KINDS}
_ANALYSIS_HOST_KIND_OF = {
    k.value: k
    for k in HOST_KINDS
    if k in (SpanCategory.ANNOTATION, SpanCategory.GPU_ANNOTATION, SpanCategory.RUNTIME, SpanCategory.PYTHON)
}


def _id(v: Any) -> int | None:
    """:func:`_int` with a fast path for the ints :func:`to_timeline` writes."""
    return v if type(v) is int else (None if v is None else _int(v))


def _track_stream(track: str) -> int:
    """A stream id for a device track without one: the same in every process (a digest of the name)."""
    return zlib.crc32(track.encode()) % 100000


def kernels_of(data: TraceData) -> Iterable[GpuEvent]:
    """The kernel events (not memcpy/memset)."""
    return (g for g in data.gpu if g.kind == "kernel")
