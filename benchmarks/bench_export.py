"""Benchmark of the exporters: a 1M-span timeline to Perfetto JSON (streamed), gzip JSON, Gantt PNG, HTML report.

Scenario: one simulated timeline of N kernel spans on 4 engines plus a host thread issuing them
(so N device spans and N/4 host spans... see ``make_timeline``), 64 layers, 12 op kinds, each span
with an op id, kind, layer, stage, definition and bound, as the simulator writes them. Each export
runs once; the time is wall-clock, and the peak memory is the growth of the process's peak RSS
over what the timeline itself already holds (so it is what the export adds: the streaming writer
should add little whatever N is), with tracemalloc's peak of Python allocations on a smaller run.

Run ``python benchmarks/bench_export.py`` (1,000,000 spans; ~1 GB of RAM for the timeline) or
``--smoke`` (20,000 spans, a few seconds). Results go to ``benchmarks/results/export.{md,json}``
unless ``--no-write``; ``--out DIR`` keeps the files it wrote.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS, machine

from opgraph.export import write_gantt, write_html_report, write_perfetto
from opgraph.ir import OpKind, Span, Stage, Timeline, TimelineKind, TimelineSource

ENGINES = 4  # device engines
LAYERS = 64  # transformer layers the spans cycle through
HOST_EVERY = 4  # one host span per this many device spans
KINDS = [k for k in OpKind if k is not OpKind.VIEW]


def make_timeline(n: int) -> Timeline:
    """A simulated timeline of ``n`` spans: device kernels round-robin on ``ENGINES`` engines, plus host spans."""
    spans: list[Span] = []
    t = 0.0
    per_layer = max(1, n // LAYERS)
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if i % (HOST_EVERY + 1) == HOST_EVERY:
            track, category, dur = "host", "host", 1.0
        else:
            track, category, dur = f"engine{i % ENGINES}", None, 2.0 + (i * 7919 % 97) / 10
        spans.append(
            Span.model_construct(
                name=f"{kind.value}_n{(i % 32) * 128}", track=track, start_us=t, dur_us=dur, op_id=i, kind=kind,
                category=category, layer=min(i // per_layer, LAYERS - 1), stage=Stage.PREFILL, step=0,
                definition=f"{kind.value}_n{(i % 32) * 128}", bound="compute" if i % 3 else "memory", args={},
            )
        )  # fmt: skip
        t += dur / ENGINES
    src = TimelineSource(kind=TimelineKind.SIMULATED, name=f"bench {n}", device="H100-SXM", config={"engines": ENGINES})
    # Spans are built in start order; model_construct skips re-validating a million spans.
    return Timeline.model_construct(source=src, spans=tuple(spans), wall_us=None, notes=())


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(name: str, fn: Callable[[], Path]) -> dict[str, Any]:
    """Run one export; wall time, peak RSS growth over the current RSS, and the file size."""
    gc.collect()
    before = _rss_mb()
    peak_before = _maxrss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    path = fn()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _maxrss_mb()
    # ru_maxrss only rises: the export's own peak shows when it exceeds every earlier peak.
    added = max(0.0, peak - max(before, peak_before)) if peak > peak_before else 0.0
    size = path.stat().st_size
    row = {
        "export": name,
        "seconds": round(secs, 3),
        "cpu_seconds": round(cpu, 3),
        "peak_rss_added_mb": round(added, 1),
        "file_mb": round(size / 2**20, 1),
    }
    print(f"{name:28s} {secs:8.2f} s ({cpu:.2f} s CPU)  +{added:7.1f} MB peak RSS  {size / 2**20:9.1f} MB", flush=True)
    return row


def traced_peak_mb(fn: Callable[[], object]) -> float:
    """Peak of Python allocations (tracemalloc) while ``fn`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--smoke", action="store_true", help="20,000 spans, a few seconds")
    ap.add_argument("--pictures-spans", type=int, default=None, help="spans for the PNG and HTML (default: --spans)")
    ap.add_argument("--out", type=Path, default=None, help="keep the exported files here")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/export.*")
    args = ap.parse_args()
    n = 20_000 if args.smoke else args.spans
    pic_n = args.pictures_spans or n
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_export_"))
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    tl = make_timeline(n)
    build = time.perf_counter() - t0
    print(f"timeline: {n} spans built in {build:.2f} s, process RSS {_rss_mb():.0f} MB", flush=True)
    rows = [
        measure("perfetto .json (streamed)", lambda: write_perfetto([tl], out / "trace.json")),
        measure("perfetto .json.gz", lambda: write_perfetto([tl], out / "trace.json.gz")),
    ]
    small = tl if pic_n == n else make_timeline(pic_n)
    rows.append(measure(f"gantt png ({pic_n} spans)", lambda: write_gantt([small], out / "gantt.png")))
    rows.append(
        measure(f"html report ({pic_n} spans)", lambda: write_html_report(out / "report.html", timelines=[small]))
    )
    # Python-allocation peak of the streamed export at a size that tracemalloc can afford.
    probe_n = min(n, 100_000)
    probe = make_timeline(probe_n)
    traced = traced_peak_mb(lambda: write_perfetto([probe], out / "probe.json"))
    print(f"tracemalloc peak of the streamed export at {probe_n} spans: {traced:.1f} MB", flush=True)

    result = {
        "machine": f"{machine()}, {len(os.sched_getaffinity(0))} cores",
        "python": platform.python_version(),
        "spans": n,
        "timeline_build_s": round(build, 2),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "exports": rows,
        "tracemalloc_peak_mb": {"spans": probe_n, "perfetto_json": round(traced, 1)},
    }
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = "export_smoke" if args.smoke else "export"
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        lines = [
            f"# Export benchmark ({n:,} spans)",
            "",
            f"Machine: {result['machine']}, Python {result['python']}. Timeline built in {build:.2f} s.",
            "Command: `python benchmarks/bench_export.py" + (" --smoke" if args.smoke else "") + "`.",
            "",
            f"Load average at the end: {result['load_average_1min_at_end']} (the machine is shared; CPU seconds are"
            " the steadier number).",
            "",
            "| export | wall s | CPU s | spans/s (CPU) | peak RSS added (MB) | file (MB) |",
            "|---|---:|---:|---:|---:|---:|",
            *[
                f"| {r['export']} | {r['seconds']} | {r['cpu_seconds']} | "
                f"{(n if 'perfetto' in r['export'] else pic_n) / max(r['cpu_seconds'], 1e-9):,.0f} | "
                f"{r['peak_rss_added_mb']} | {r['file_mb']} |"
                for r in rows
            ],
            "",
            f"tracemalloc peak of the streamed Perfetto export at {probe_n:,} spans: {traced:.1f} MB "
            "(Python allocations: one batch of 4096 encoded events, and two floats per span for the utilisation"
            " counters).",
            "",
        ]
        (RESULTS / f"{name}.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
