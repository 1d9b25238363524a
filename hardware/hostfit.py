"""Fit a :class:`~hardware.hostprofile.HostProfile` from graphs captured with ``--host-timing``.

Every op of every training graph is one sample of the framework time before an op of its
:func:`~hardware.hostprofile.structure_keys`; each key's median (and 10th/90th percentiles) over its
samples is kept, at each lookup level. The graphs must all have been timed on one CPU.

Measured walls of some training graphs (the median CUDA-synchronised wall of one forward on the
device) fit two more terms (:func:`fit_wall_terms`): the in-context scale of each op's host time and
a host time per forward pass (:attr:`~hardware.hostprofile.HostProfile.op_scale`,
:attr:`~hardware.hostprofile.HostProfile.forward_us`), least squares on the relative wall error of
the simulated walls, which the caller provides (``benchmarks/gpu/host_profile.sh`` simulates each
training graph as ``opgraph simulate -H HW -e 1 --policy stream`` does for a graph captured without
host timing).

``python -m hardware.hostfit GRAPH... -o h100-sxm.host.json [--device-profile FILE]`` builds one
from the captures (``--device-profile`` copies its host time per aten call into the profile as the
issue time).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from hardware.hostprofile import GapStat, HostInfo, HostProfile, TrainingGraph, WallSample, graph_keys
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


WallFn = Callable[[OpGraph, HostProfile], float]
"""Simulated wall (us) of a graph captured without host timing, with a candidate host profile."""


ROBUST_FLOOR = 0.02
"""Relative error below which the robust wall fit weighs a training wall as if it were this large."""


def fit_wall_terms(
    profile: HostProfile,
    graphs: Mapping[str, OpGraph],
    walls_us: Mapping[str, float],
    simulate_wall: WallFn,
    *,
    iterations: int = 20,
    robust: bool = True,
) -> HostProfile:
    """``profile`` with :attr:`~HostProfile.op_scale` and :attr:`~HostProfile.forward_us` fitted so that
    ``simulate_wall`` of each named graph (captured without host timing, or stripped of it) meets its
    measured wall: Gauss-Newton on the relative errors (finite differences, both terms kept >= 0),
    with ``robust`` on their absolute values (iteratively reweighted: a wall measured while the host
    was disturbed pulls the fit no more than any other), else on their squares.

    Needs walls of at least two graphs of different host time (layer counts), else the two terms
    cannot be told apart: :class:`~opgraph.ir.OpgraphError`.
    """
    names = [n for n in graphs if n in walls_us and walls_us[n] > 0]
    if len(names) < 2:
        raise OpgraphError(
            f"{len(names)} training graph(s) with a measured wall: the per-forward and per-op terms need two or more",
            hint="measure the walls of training graphs of several layer counts (benchmarks/gpu/host_profile.sh)",
        )

    def residuals(scale: float, forward: float) -> list[float]:
        cand = profile.model_copy(update={"op_scale": scale, "forward_us": forward})
        return [simulate_wall(graphs[n], cand) / walls_us[n] - 1 for n in names]

    def loss(rs: Sequence[float]) -> float:
        return sum(abs(r) for r in rs) if robust else sum(r * r for r in rs)

    base = residuals(1.0, 0.0)
    scale, forward = 1.0, 0.0
    res = base
    for _ in range(iterations):
        w = [1 / max(abs(r), ROBUST_FLOOR) if robust else 1.0 for r in res]
        ds, df = 0.01 * scale, 20.0
        r_s = residuals(scale + ds, forward)
        r_f = residuals(scale, forward + df)
        js = [(a - b) / ds for a, b in zip(r_s, res, strict=True)]
        jf = [(a - b) / df for a, b in zip(r_f, res, strict=True)]
        # Normal equations of the weighted 2x2 least-squares step.
        a11 = sum(k * x * x for k, x in zip(w, js, strict=True))
        a12 = sum(k * x * y for k, x, y in zip(w, js, jf, strict=True))
        a22 = sum(k * y * y for k, y in zip(w, jf, strict=True))
        b1 = -sum(k * x * r for k, x, r in zip(w, js, res, strict=True))
        b2 = -sum(k * y * r for k, y, r in zip(w, jf, res, strict=True))
        det = a11 * a22 - a12 * a12
        if det <= 1e-6 * a11 * a22:  # the two columns (nearly) proportional
            raise OpgraphError(
                "the training walls do not tell the per-forward time from the per-op scale",
                hint="measure walls of training graphs of several layer counts",
            )
        step_s, step_f = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        for _halving in range(5):  # backtrack until the step lowers the loss
            new_scale, new_forward = max(0.05, scale + step_s), max(0.0, forward + step_f)
            new_res = residuals(new_scale, new_forward)
            if loss(new_res) <= loss(res):
                break
            step_s, step_f = step_s / 2, step_f / 2
        else:
            break
        done = abs(new_scale - scale) < 1e-4 and abs(new_forward - forward) < 0.5
        scale, forward, res = new_scale, new_forward, new_res
        if done:
            break
    samples = tuple(
        WallSample(
            name=n,
            measured_us=round(walls_us[n], 1),
            predicted_us=round(walls_us[n] * (1 + r), 1),
            unfitted_us=round(walls_us[n] * (1 + r0), 1),
        )
        for n, r, r0 in zip(names, res, base, strict=True)
    )
    if not all(math.isfinite(x) for x in (scale, forward)):
        raise OpgraphError("the wall fit diverged")
    return profile.model_copy(update={"op_scale": round(scale, 4), "forward_us": round(forward, 1), "walls": samples})


def describe_walls(profile: HostProfile) -> list[str]:
    """The wall terms of ``profile`` and each training wall, measured, fitted and unfitted (lines)."""
    if not profile.walls:
        return ["no wall terms: op scale 1, no forward time (fitted without measured walls)"]
    lines = [
        f"in context: op host time x{profile.op_scale:.3f}, {profile.forward_us:.1f} us per forward "
        f"(fitted on {len(profile.walls)} measured walls)"
    ]
    for w in profile.walls:
        lines.append(
            f"  {w.name}: measured {w.measured_us / 1e3:.3f} ms, fitted {w.predicted_us / 1e3:.3f} ms "
            f"({100 * (w.predicted_us / w.measured_us - 1):+.1f}%), unfitted {w.unfitted_us / 1e3:.3f} ms "
            f"({100 * (w.unfitted_us / w.measured_us - 1):+.1f}%)"
        )
    return lines


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
