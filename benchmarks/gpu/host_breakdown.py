"""Where a host-bound model run spends its host time: framework vs issue, meta vs the device, GC.

For one case of ``accuracy.py`` this script measures on the device:

1. the plain wall time, alternating runs with Python's garbage collector on and off, and the host
   time until ``forward`` returns (before the final sync);
2. the phase under the CPU profiler (CPU activity only) on the device and on ``meta``, lined up
   with the recording: per op, the framework time before it and the time of its own calls in the
   model (the issue time in context, which replay measures in isolation);
3. the framework time of ``capture --host-timing`` before and after, for the host's drift.

It writes ``{case}.host.json`` under ``--out``. Nothing here fits a model: it is a diagnostic.

``--traces DATA`` (CPU only) reads the held-out runs instead (``heldout.tar.gz`` or its folder, from
``benchmarks/gpu/heldout.py``) and prints where the host time of each profiled forward went: before
the model's first aten call, the preamble before layer 0, each layer, after the last layer, after the
forward returned (the sync); per region the time inside top-level aten calls that launch kernels (issue
in context), inside the others, and between calls (Python); the device's busy time beside it. The
profiled run is slower than the plain runs (the profiler and the per-module ranges): the last column
scales the profiled regions by the plain median wall over the profiled run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.gpu.accuracy import CASES  # noqa: E402


def per_op(calls: list[tuple[float, float, int | None]]) -> tuple[dict[int, float], dict[int, float]]:
    """Framework time before each op and the time of its own calls (with the Python between them)."""
    fw: dict[int, float] = {}
    own: dict[int, float] = {}
    pending = 0.0
    last: int | None = None
    for gap, t, owner in calls:
        if owner is None:
            pending += gap + t
            continue
        if owner == last and pending == 0.0:
            own[owner] = own.get(owner, 0.0) + gap + t
        else:
            fw[owner] = fw.get(owner, 0.0) + pending + gap
            own[owner] = own.get(owner, 0.0) + t
        pending = 0.0
        last = owner
    return fw, own


LAUNCHES = frozenset(
    {"cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemsetAsync",
     "cudaMemcpyAsync"}
)  # fmt: skip
"""Runtime calls that put work on the device."""


def trace_regions(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Host time of one held-out profiled run by region (see the module docstring), microseconds."""
    xs = [e for e in events if e.get("ph") == "X"]
    run = next(e for e in xs if e["name"].startswith("heldout_run_"))
    r0, r1, tid = run["ts"], run["ts"] + run["dur"], run["tid"]
    cpu = sorted((e for e in xs if e.get("tid") == tid and r0 <= e["ts"] <= r1), key=lambda e: (e["ts"], -e["dur"]))
    model = next(e for e in cpu if e["name"] == "heldout_mod:")
    layers = sorted(
        (e for e in cpu if e["name"].startswith("heldout_mod:model.layers.") and e["name"].count(".") == 2),
        key=lambda e: e["ts"],
    )
    launches = [e["ts"] for e in cpu if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in LAUNCHES]
    top: list[dict[str, Any]] = []
    end = -1.0
    for e in cpu:
        if e.get("cat") == "cpu_op" and e["ts"] >= end:
            top.append(e)
            end = e["ts"] + e["dur"]
    m0, m1 = model["ts"], model["ts"] + model["dur"]
    bounds = [("before model", r0, m0), ("preamble", m0, layers[0]["ts"])]
    bounds += [(f"layer {i}", e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(layers)]
    bounds += [("after layers", layers[-1]["ts"] + layers[-1]["dur"], m1), ("after return", m1, r1)]
    out: dict[str, Any] = {}
    for name, a, b in bounds:
        calls = [e for e in top if a <= e["ts"] < b]
        issuing = [e for e in calls if any(e["ts"] <= t <= e["ts"] + e["dur"] for t in launches)]
        issue = sum(e["dur"] for e in issuing)
        other = sum(e["dur"] for e in calls) - issue
        out[name] = {"us": b - a, "issue_us": issue, "other_calls_us": other, "between_us": b - a - issue - other,
                     "issuing_calls": len(issuing)}  # fmt: skip
    device = [e for e in xs if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    out["run"] = {"us": r1 - r0, "device_busy_us": sum(e["dur"] for e in device)}
    return out


def print_traces(data: Path) -> int:
    """``--traces``: the region table of every held-out case in ``data``."""
    import gzip
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = data
        if data.is_file():
            with tarfile.open(data) as tar:
                tar.extractall(tmp, filter="data")
            folder = next(p.parent for p in Path(tmp).rglob("summary.json"))
        for case in sorted(folder.glob("*.trace.json.gz")):
            name = case.name.removesuffix(".trace.json.gz")
            measured = json.loads((folder / f"{name}.json").read_text())
            with gzip.open(case, "rt") as f:
                regions = trace_regions(json.load(f)["traceEvents"])
            wall = measured["wall_us"]["median"]
            k = wall / regions["run"]["us"]
            print(f"{name}: plain wall {wall / 1e3:.3f} ms, profiled run {regions['run']['us'] / 1e3:.3f} ms "
                  f"(x{k:.2f}), device busy {regions['run']['device_busy_us'] / 1e3:.3f} ms")  # fmt: skip
            for r, v in regions.items():
                if r != "run":
                    print(f"  {r:13s} {v['us']:8.1f} us: issuing calls {v['issue_us']:7.1f} ({v['issuing_calls']:3d}), "
                          f"other calls {v['other_calls_us']:6.1f}, between {v['between_us']:7.1f}; "
                          f"scaled {k * v['us']:8.1f}")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, help="held-out data (heldout.tar.gz or folder): CPU-side region table")
    if "--traces" in sys.argv:
        return print_traces(ap.parse_known_args()[0].traces)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--detail-layer", type=int, default=10, help="print the calls of this layer's ops")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from opgraph.capture import capture
    from opgraph.capture.api import CaptureOptions, prepare, run_phase, setup_phase
    from opgraph.capture.hosttime import _PhaseRun, align_profile, clock_cost_ns, owned_calls
    from opgraph.capture.recorder import Recorder

    kw = {k: v for k, v in CASES[args.case].items() if k != "model"}
    model = CASES[args.case]["model"]
    out: dict[str, Any] = {"case": args.case, "torch": torch.__version__}

    def meta_fw() -> float:
        g = capture(model, device="meta", host_timing=True, **kw)
        timing = g.metadata.host_timing
        assert timing is not None
        return timing.total_us

    out["meta_framework_before_us"] = meta_fw()

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def profiled_calls(prepared: Any, opts: Any, rec_ops: list[int | None], targets: list[str]) -> Any:
        cache = setup_phase(prepared, opts)
        sync()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_phase(prepared, opts, _PhaseRun(), cache)
            sync()
        events = prof.events()
        return align_profile(events, rec_ops, targets), len(events)

    def detail(prepared: Any, opts: Any, graph: Any, rec_ops: list[int | None], targets: list[str]) -> Any:
        """One run profiled with device activity: the call trees of one layer's ops and the runtime
        calls (launches, allocations, syncs) of the whole phase."""
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        cache = setup_phase(prepared, opts)
        sync()
        with profile(activities=acts) as prof:
            run_phase(prepared, opts, _PhaseRun(), cache)
            sync()
        events = prof.events()
        runtime: dict[str, list[float]] = {}
        for e in events:
            if e.name.startswith("cuda") or e.name.startswith("cu"):
                runtime.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
        lines: list[str] = []

        def tree(e: Any, depth: int) -> None:
            lines.append(f"{'  ' * depth}{e.name} {e.time_range.end - e.time_range.start:.1f}")
            for c in sorted(e.cpu_children, key=lambda c: c.time_range.start):
                tree(c, depth + 1)

        calls = owned_calls(events, rec_ops, targets) or []
        shown = None
        for call, owner, _ in calls:
            if owner is not None and graph.ops[owner].layer == args.detail_layer:
                if owner != shown:
                    lines.append(f"op {owner} {graph.ops[owner].definition}:")
                    shown = owner
                tree(call, 1)
        print("\n".join(lines), flush=True)
        return {
            "runtime": {k: [len(v), round(sum(v), 1), round(max(v), 1)] for k, v in runtime.items()},
            "layer_calls": lines,
        }

    for device in (args.device, "meta"):
        opts = CaptureOptions(device=device, **kw)
        prepared = prepare(model, opts)
        rec = Recorder()
        rec.add_root(prepared.model)
        run_phase(prepared, opts, rec)
        from opgraph.capture.api import _metadata_args, graph_from_recording

        graph, event_op = graph_from_recording(rec, **_metadata_args(prepared, opts))
        targets = [e.target for e in rec.events]
        res: dict[str, Any] = {"ops": len(graph.ops), "calls": len(targets)}
        res["profiler_cost_us"] = clock_cost_ns(device, profiled=True) / 1e3
        if device != "meta":
            run_phase(prepared, opts, None)  # warm-up
            walls: dict[str, list[float]] = {"gc_on": [], "gc_off": []}
            returns: dict[str, list[float]] = {"gc_on": [], "gc_off": []}
            for i in range(2 * args.repeats):
                key = "gc_on" if i % 2 == 0 else "gc_off"
                cache = setup_phase(prepared, opts)
                gc.collect()
                if key == "gc_off":
                    gc.disable()
                sync()
                t0 = time.perf_counter()
                run_phase(prepared, opts, None, cache)
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                gc.enable()
                walls[key].append((t2 - t0) * 1e6)
                returns[key].append((t1 - t0) * 1e6)
            res["wall_us"] = {k: statistics.median(v) for k, v in walls.items()}
            res["wall_all_us"] = walls
            res["host_return_us"] = {k: statistics.median(v) for k, v in returns.items()}
        runs = []
        seq_prof: list[dict[str, list[float]]] = []
        seq_plain: list[dict[str, list[float]]] = []
        seq_ctx: Any = None
        if device != "meta":
            # Replay's cases called in the graph's order, profiled like the model run and not,
            # alternating with the model's profiled runs: is the sequence's issue time the model's?
            from validators import Replayer, ReplayOptions, unique_configs
            from validators.sequence import IssueSequence

            rep = Replayer(device, ReplayOptions(check=False, energy=False, sm_clock=False))
            seq_ctx = IssueSequence([graph], unique_configs([graph]), rep)
            seq_ctx.round()
        for i in range(4):
            gc.collect()
            calls, n_events = profiled_calls(prepared, opts, event_op, targets)
            runs.append((calls, n_events))
            if seq_ctx is not None and i:
                with profile(activities=[ProfilerActivity.CPU]):
                    seq_prof.append(seq_ctx.round())
                seq_plain.append(seq_ctx.round())
        if seq_ctx is not None:
            from validators.configs import config_key

            seq_ctx.close()
            key_def = {config_key(op): op.definition for op in graph.ops}
            uses: dict[str, int] = {}
            for op in graph.ops:
                uses[op.definition] = uses.get(op.definition, 0) + 1

            def by_def(rounds: list[dict[str, list[float]]], key_def: dict[str, str] = key_def) -> dict[str, float]:
                merged: dict[str, list[float]] = {}
                for r in rounds:
                    for k, xs in r.items():
                        merged.setdefault(key_def[k], []).extend(xs)
                return {d: statistics.median(v) for d, v in merged.items()}

            res["sequence_profiled_by_def"] = by_def(seq_prof)
            res["sequence_plain_by_def"] = by_def(seq_plain)
            res["sequence_round_totals_us"] = {
                "profiled": [sum(map(sum, r.values())) for r in seq_prof],
                "plain": [sum(map(sum, r.values())) for r in seq_plain],
            }
            print(json.dumps(res["sequence_round_totals_us"]), flush=True)
        runs = runs[1:]
        aligned = [c for c, _ in runs if c is not None]
        res["aligned_runs"] = len(aligned)
        res["profiled_events"] = runs[-1][1]
        if aligned:
            fws, owns = zip(*(per_op(c) for c in aligned), strict=True)
            ids = sorted(set().union(*fws, *owns))
            fw = {i: statistics.median(f.get(i, 0.0) for f in fws) for i in ids}
            own = {i: statistics.median(o.get(i, 0.0) for o in owns) for i in ids}
            res["framework_total_us"] = sum(fw.values())
            res["own_total_us"] = sum(own.values())
            res["per_op"] = {str(i): [round(fw[i], 2), round(own[i], 2), graph.ops[i].definition] for i in ids}
        else:
            tot = [sum(g + t for g, t, _ in (c or [])) for c, _ in runs]
            res["unaligned_total_us"] = tot
        if device != "meta":
            res["detail"] = detail(prepared, opts, graph, event_op, targets)
        out[device] = res
        print(json.dumps({k: v for k, v in res.items() if k not in ("per_op", "wall_all_us")}), flush=True)
        del prepared, rec, graph
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    out["meta_framework_after_us"] = meta_fw()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.case}.host.json").write_text(json.dumps(out, indent=1))
    print({k: out[k] for k in ("meta_framework_before_us", "meta_framework_after_us")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
