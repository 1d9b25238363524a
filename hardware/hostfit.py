"""Fit a :class:`~hardware.hostprofile.HostProfile` from graphs captured with ``--host-timing``.

Every op of every training graph is one sample of the framework time before an op of its
:func:`~hardware.hostprofile.structure_keys`; each key's median (and 10th/90th percentiles) over its
samples is kept, at each lookup level. The graphs must all have been timed on one CPU.

``python -m hardware.hostfit GRAPH... -o h100-sxm.host.json [--device-profile FILE]`` builds one
(``--device-profile`` copies its host time per aten call into the profile as the issue time).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from hardware.hostprofile import GapStat, HostInfo, HostProfile, TrainingGraph, graph_keys
from opgraph.ir import LoadError, OpGraph, OpgraphError, capture_settings


def _stat(values: Sequence[float]) -> GapStat:
    ordered = sorted(values)
    n = len(ordered)

    def pct(q: float) -> float:
        return ordered[min(n - 1, max(0, round(q * (n - 1))))]

    return GapStat(
        median_us=round(statistics.median(ordered), 3), p10_us=round(pct(0.1), 3), p90_us=round(pct(0.9), 3), n=n
    )


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _shape(graph: OpGraph) -> str:
    s = capture_settings(graph.metadata.capture)
    parts = [f"b{s.batch}" if s.batch else ""]
    phase = graph.metadata.phase
    if phase in ("prefill", "generate") and s.seq_len:
        parts.append(f"s{s.seq_len}")
    if phase == "decode" and s.kv_len:
        parts.append(f"kv{s.kv_len}")
    parts += [s.dtype or "", f"{s.layers}L" if s.layers else ""]
    return " ".join(p for p in parts if p)


def host_info(cpu: str) -> HostInfo:
    """Provenance for a profile fitted on this machine from graphs timed on ``cpu``."""
    return HostInfo(
        cpu=cpu,
        cores=os.cpu_count() or 0,
        torch=_version("torch"),
        transformers=_version("transformers"),
        python=platform.python_version(),
        platform=platform.platform(),
        date=datetime.now(UTC).replace(microsecond=0).isoformat(),
    )


def fit_host_profile(
    graphs: Sequence[OpGraph],
    *,
    host: HostInfo | None = None,
    issue_us: float | None = None,
    issue_source: str = "",
    notes: Sequence[str] = (),
) -> HostProfile:
    """A host profile from host-timed ``graphs`` (captured with ``--host-timing`` on one CPU).

    Raises :class:`~opgraph.ir.OpgraphError` when there are no graphs, a graph has no host timing, or
    the graphs were timed on different CPUs.
    """
    if not graphs:
        raise OpgraphError("no training graphs to fit a host profile from")
    cpus = set()
    for i, g in enumerate(graphs):
        timing = g.metadata.host_timing
        if timing is None or all(op.host_gap_us is None for op in g.ops):
            raise OpgraphError(
                f"graph {i} ({g.metadata.model} {g.metadata.phase}) has no host timing",
                hint="capture the training graphs with `opgraph capture --host-timing`",
            )
        cpus.add(timing.cpu)
    if len(cpus) > 1:
        raise OpgraphError(
            f"the training graphs were timed on {len(cpus)} CPUs ({', '.join(sorted(cpus))})",
            hint="a host profile describes one CPU: fit one per CPU",
        )
    samples: dict[str, dict[str, list[float]]] = {"exact": {}, "target": {}, "kind": {}}
    everything: list[float] = []
    training: list[TrainingGraph] = []
    for g in graphs:
        measured = 0
        total = 0.0
        for op, keys in zip(g.ops, graph_keys(g), strict=True):
            if op.host_gap_us is None:
                continue
            measured += 1
            total += op.host_gap_us
            everything.append(op.host_gap_us)
            for level, key in zip(("exact", "target", "kind"), keys, strict=True):
                samples[level].setdefault(key, []).append(op.host_gap_us)
        md = g.metadata
        training.append(
            TrainingGraph(
                model=md.model,
                architecture=md.architecture,
                phase=md.phase,
                shape=_shape(g),
                ops=measured,
                total_us=round(total, 1),
            )
        )
    if not everything:
        raise OpgraphError("the training graphs have no ops with a measured host gap")
    cpu = cpus.pop()
    info = host if host is not None else host_info(cpu)
    if info.cpu != cpu:
        info = info.model_copy(update={"cpu": cpu})
    return HostProfile(
        host=info,
        issue_us=issue_us,
        issue_source=issue_source,
        exact={k: _stat(v) for k, v in sorted(samples["exact"].items())},
        target={k: _stat(v) for k, v in sorted(samples["target"].items())},
        kind={k: _stat(v) for k, v in sorted(samples["kind"].items())},
        global_gap=_stat(everything),
        training=tuple(training),
        notes=tuple(notes),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hardware.hostfit GRAPH... -o OUT [--device-profile FILE] [--note TEXT]``."""
    parser = argparse.ArgumentParser(prog="python -m hardware.hostfit", description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="+", type=Path, help="graphs captured with --host-timing")
    parser.add_argument("-o", "--output", type=Path, required=True, help="host profile to write (.host.json)")
    parser.add_argument("--device-profile", type=Path, help="device profile whose aten issue time to carry")
    parser.add_argument("--note", action="append", default=[], help="a remark to keep in the profile")
    args = parser.parse_args(argv)
    from opgraph.ir import load_graph

    try:
        graphs = [load_graph(p) for p in args.graphs]
        issue: float | None = None
        source = ""
        if args.device_profile is not None:
            from hardware.profile import load_profile

            dev = load_profile(args.device_profile)
            issue, source = dev.aten_issue_us, f"device profile {args.device_profile.name}"
        prof = fit_host_profile(graphs, issue_us=issue, issue_source=source, notes=args.note)
    except (LoadError, OpgraphError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prof.save(args.output)
    g = prof.global_gap
    print(
        f"host profile -> {args.output}: {len(graphs)} graphs on {prof.host.cpu}; {len(prof.exact)} exact keys, "
        f"{len(prof.target)} kind+target, {len(prof.kind)} kind; global median {g.median_us:.2f} us "
        f"(p10 {g.p10_us:.2f}, p90 {g.p90_us:.2f}) over {g.n} ops"
    )
    for t in prof.training:
        print(f"  {t.model} {t.phase} {t.shape}: {t.ops} ops, {t.total_us / 1e3:.3f} ms framework time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
