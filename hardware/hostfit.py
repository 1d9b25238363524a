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

The host time of torch's ``_grouped_mm`` fallback (:class:`~hardware.hostprofile.FallbackLoop`) comes
from a measurement of the call at several expert loads on the same machine
(``benchmarks/gpu/grouped_fallback_host.py``): :func:`fit_fallback_loops`.

``python -m hardware.hostfit GRAPH... -o h100-sxm.host.json [--device-profile FILE] [--fallback FILE]``
builds one from the captures (``--device-profile`` copies its host time per aten call into the profile
as the issue time, ``--fallback`` adds the fallback's measured loops).
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

import numpy as np

from hardware.hostprofile import (
    FallbackLoop,
    GapStat,
    HostInfo,
    HostProfile,
    TrainingGraph,
    WallSample,
    graph_keys,
)
from opgraph.ir import LoadError, OpGraph, OpgraphError, capture_settings, is_nested


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


OUTLIER_FACTOR = 3.0
"""A training graph whose framework time per op is this many times the median graph's is left out."""


def _per_op_us(graph: OpGraph) -> float:
    gaps = [op.host_gap_us for op in graph.ops if op.host_gap_us is not None]
    return sum(gaps) / len(gaps) if gaps else 0.0


def _without_outliers(graphs: Sequence[OpGraph], factor: float | None) -> tuple[list[OpGraph], list[str]]:
    """``graphs`` less those timed while the host was disturbed (see :func:`fit_host_profile`), and a
    note for each left out."""
    if factor is None or len(graphs) < 3:
        return list(graphs), []
    per_op = [_per_op_us(g) for g in graphs]
    mid = statistics.median(per_op)
    kept: list[OpGraph] = []
    notes: list[str] = []
    for g, x in zip(graphs, per_op, strict=True):
        if mid > 0 and (x > factor * mid or x < mid / factor):
            notes.append(
                f"left out {g.metadata.model} {g.metadata.phase} {_shape(g)}: {x:.1f} us of framework time per op, "
                f"{x / mid:.1f}x the median training graph's (timed while the host was disturbed)"
            )
        else:
            kept.append(g)
    return kept, notes


def fit_host_profile(
    graphs: Sequence[OpGraph],
    *,
    host: HostInfo | None = None,
    issue_us: float | None = None,
    issue_source: str = "",
    notes: Sequence[str] = (),
    max_outlier: float | None = OUTLIER_FACTOR,
) -> HostProfile:
    """A host profile from host-timed ``graphs`` (captured with ``--host-timing`` on one CPU).

    A graph whose framework time per op is more than ``max_outlier`` times the median graph's (or less
    than its ``1 / max_outlier``) was timed while the host was disturbed: it is left out, and the
    profile's notes say so (``None`` keeps every graph).

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
    graphs, left_out = _without_outliers(graphs, max_outlier)
    notes = (*notes, *left_out)
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

WALL_TERMS: tuple[str, ...] = ("op_scale", "forward_us", "nested_scale", "busy_scale")
"""The :class:`HostProfile` terms :func:`fit_wall_terms` fits, in order; ``nested_scale`` only when a
training graph holds nested ops (:func:`~opgraph.ir.is_nested`), and the last is left at 0 when the
training walls cannot tell it from the others."""
_START = {"op_scale": 1.0, "forward_us": 0.0, "nested_scale": 1.0, "busy_scale": 0.0}
_STEP = {"op_scale": 0.01, "forward_us": 20.0, "nested_scale": 0.01, "busy_scale": 0.02}
_LOW = {"op_scale": 0.05, "forward_us": 0.0, "nested_scale": 0.05, "busy_scale": 0.0}
_RELATIVE = frozenset({"op_scale", "nested_scale"})
"""Terms stepped relative to their value (scales)."""


def fit_wall_terms(
    profile: HostProfile,
    graphs: Mapping[str, OpGraph],
    walls_us: Mapping[str, float],
    simulate_wall: WallFn,
    *,
    iterations: int = 20,
    robust: bool = True,
    terms: Sequence[str] = WALL_TERMS,
) -> HostProfile:
    """``profile`` with the wall ``terms`` (:data:`WALL_TERMS`) fitted so that ``simulate_wall`` of each
    named graph (captured without host timing, or stripped of it) meets its measured wall:
    Gauss-Newton on the relative errors (finite differences, every term kept >= 0), with ``robust`` on
    their absolute values (iteratively reweighted: a wall measured while the host was disturbed pulls
    the fit no more than any other), else on their squares. When the walls cannot tell the last term
    from the others it stays at 0 and the rest are fitted.

    Needs walls of at least two graphs of different host time (layer counts), else the per-forward and
    per-op terms cannot be told apart: :class:`~opgraph.ir.OpgraphError`.
    """
    names = [n for n in graphs if n in walls_us and walls_us[n] > 0]
    if not any(is_nested(op) for n in names for op in graphs[n].ops):
        terms = [t for t in terms if t != "nested_scale"]  # nothing to tell it from: it stays 1
    if len(names) < 2:
        raise OpgraphError(
            f"{len(names)} training graph(s) with a measured wall: the per-forward and per-op terms need two or more",
            hint="measure the walls of training graphs of several layer counts (benchmarks/gpu/host_profile.sh)",
        )

    def residuals(values: Mapping[str, float]) -> list[float]:
        cand = profile.model_copy(update={**_START, **values})
        return [simulate_wall(graphs[n], cand) / walls_us[n] - 1 for n in names]

    def loss(rs: Sequence[float]) -> float:
        return sum(abs(r) for r in rs) if robust else sum(r * r for r in rs)

    base = residuals({})
    fitted = _gauss_newton(residuals, loss, base, list(terms), iterations, robust)
    if fitted is None and len(terms) > 2:
        fitted = _gauss_newton(residuals, loss, base, list(terms[:-1]), iterations, robust)
    if fitted is None:
        raise OpgraphError(
            "the training walls do not tell the per-forward time from the per-op scale",
            hint="measure walls of training graphs of several layer counts",
        )
    values, res = fitted
    samples = tuple(
        WallSample(
            name=n,
            measured_us=round(walls_us[n], 1),
            predicted_us=round(walls_us[n] * (1 + r), 1),
            unfitted_us=round(walls_us[n] * (1 + r0), 1),
        )
        for n, r, r0 in zip(names, res, base, strict=True)
    )
    if not all(math.isfinite(x) for x in values.values()):
        raise OpgraphError("the wall fit diverged")
    rounded = {k: round(v, 1 if k == "forward_us" else 4) for k, v in {**_START, **values}.items()}
    return profile.model_copy(update={**rounded, "walls": samples})


def _weighted_step(cols: list[list[float]], w: Sequence[float], res: Sequence[float]) -> list[float] | None:
    """The weighted least-squares step of the linearised residuals (columns ``cols``); ``None`` when
    the columns are (nearly) collinear or one is zero."""
    jac = np.array(cols, dtype=float).T  # one row per training wall, one column per term
    weights = np.asarray(w, dtype=float)
    a = jac.T @ (jac * weights[:, None])
    b = -jac.T @ (weights * np.asarray(res, dtype=float))
    diag = np.diag(a)
    if diag.min() <= 0.0:
        return None
    norm = np.sqrt(diag)
    corr = a / np.outer(norm, norm)  # a correlation matrix: singular means collinear
    if np.linalg.cond(corr) > 1e9:
        return None
    return [float(x) for x in np.linalg.solve(corr, b / norm) / norm]


def _gauss_newton(
    residuals: Callable[[Mapping[str, float]], list[float]],
    loss: Callable[[Sequence[float]], float],
    base: list[float],
    terms: list[str],
    iterations: int,
    robust: bool,
) -> tuple[dict[str, float], list[float]] | None:
    """(term values, residuals) of the (reweighted) Gauss-Newton fit of ``terms``; ``None`` when the
    walls cannot tell them apart."""
    values = {t: _START[t] for t in terms}
    res = base
    for _ in range(iterations):
        w = [1 / max(abs(r), ROBUST_FLOOR) if robust else 1.0 for r in res]
        cols: dict[str, list[float]] = {}
        for t in terms:
            d = _STEP[t] * (values[t] if t in _RELATIVE else 1.0)
            moved = residuals({**values, t: values[t] + d})
            cols[t] = [(a - b) / d for a, b in zip(moved, res, strict=True)]
        active = list(terms)
        while True:  # a term at its bound that the step would push further is held there
            solved = _weighted_step([cols[t] for t in active], w, res)
            if solved is None:
                return None
            held = [t for t, x in zip(active, solved, strict=True) if x < 0 and values[t] <= _LOW[t]]
            if not held:
                break
            active = [t for t in active if t not in held]
            if not active:
                return values, res
        step = dict(zip(active, solved, strict=True))
        for _halving in range(5):  # backtrack until the step lowers the loss
            new = {t: max(_LOW[t], values[t] + step.get(t, 0.0)) for t in terms}
            new_res = residuals(new)
            if loss(new_res) <= loss(res):
                break
            step = {t: x / 2 for t, x in step.items()}
        else:
            break
        done = all(abs(new[t] - values[t]) < _STEP[t] / 100 for t in terms)
        values, res = new, new_res
        if done:
            break
    return values, res


def describe_walls(profile: HostProfile) -> list[str]:
    """The wall terms of ``profile`` and each training wall, measured, fitted and unfitted (lines)."""
    if not profile.walls:
        return ["no wall terms: op scale 1, no forward time (fitted without measured walls)"]
    busy = f" x(1 + {profile.busy_scale:.3f} x device busy share)" if profile.busy_scale else ""
    nested = f", nested calls' issue time x{profile.nested_scale:.3f}" if profile.nested_scale != 1.0 else ""
    lines = [
        f"in context: op host time x{profile.op_scale:.3f}{busy}{nested}, {profile.forward_us:.1f} us per forward "
        f"(fitted on {len(profile.walls)} measured walls)"
    ]
    for w in profile.walls:
        lines.append(
            f"  {w.name}: measured {w.measured_us / 1e3:.3f} ms, fitted {w.predicted_us / 1e3:.3f} ms "
            f"({100 * (w.predicted_us / w.measured_us - 1):+.1f}%), unfitted {w.unfitted_us / 1e3:.3f} ms "
            f"({100 * (w.unfitted_us / w.measured_us - 1):+.1f}%)"
        )
    return lines


def with_fallback_loops(profile: HostProfile, path: Path) -> HostProfile:
    """``profile`` with the fallback loops of the ``grouped_fallback_host.py`` result ``path``
    (:func:`fit_fallback_loops`) and a note naming the file and its device; a file that is not one is a
    one-line :class:`~opgraph.ir.OpgraphError`."""
    import json

    try:
        measured = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpgraphError(f"cannot read the fallback measurement: {exc}", where=str(path)) from None
    if not isinstance(measured, dict) or not isinstance(measured.get("rows"), list):
        raise OpgraphError("not a grouped_fallback_host.py result (a JSON object with a 'rows' list)", where=str(path))
    try:
        loops = fit_fallback_loops(measured)
    except OpgraphError as exc:
        raise OpgraphError(exc.message, where=str(path)) from None
    if not loops:
        raise OpgraphError("no expert shape measured at two or more loads", where=str(path))
    note = (
        f"grouped_fallback: torch's _grouped_mm fallback measured on {measured.get('device', '?')} "
        f"({measured.get('date', '?')}, torch {measured.get('torch', '?')}) by {path.name}: "
        + ", ".join(f"{x.experts}x{x.n}x{x.k} {x.first_us:.0f} + {x.per_expert_us:.1f}/expert us" for x in loops)
    )
    notes = tuple(n for n in profile.notes if not n.startswith("grouped_fallback:"))
    return profile.model_copy(update={"grouped_fallback": loops, "notes": (*notes, note)})


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """The least-squares line through the points ``(xs[i], ys[i])``: its value at 0 and its slope (at least
    two distinct ``xs``).

    >>> line_fit([1, 2, 3], [5.0, 7.0, 9.0])
    (3.0, 2.0)
    """
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def fit_fallback_loops(measured: Mapping[str, object]) -> tuple[FallbackLoop, ...]:
    """One :class:`~hardware.hostprofile.FallbackLoop` per expert shape of a
    ``grouped_fallback_host.py`` result (its ``rows``: one record per shape, rows per expert and experts
    active, with ``idle_us``, the call's host time with the device idle before it): per active count the
    median over the rows per expert (the host time does not follow them), then a least-squares line over
    the active counts. A shape measured at fewer than two active counts is left out.

    >>> rows = [{"shape": "s", "experts": 8, "k": 32, "n": 64, "rows": r, "active": a, "idle_us": 30.0 + 15 * a}
    ...         for r in (1, 4) for a in (1, 4, 8)]
    >>> fit_fallback_loops({"rows": rows})[0].model_dump()
    {'experts': 8, 'n': 64, 'k': 32, 'first_us': 45.0, 'per_expert_us': 15.0, 'calls': 6}
    """
    records = measured.get("rows")
    if not isinstance(records, list):
        raise OpgraphError("not a grouped_fallback_host.py result: no 'rows' list")
    by_shape: dict[tuple[int, int, int], dict[int, list[float]]] = {}
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "idle_us" not in r:
            continue  # the Python-level mm lines
        try:
            key = (int(r["experts"]), int(r["n"]), int(r["k"]))
            by_shape.setdefault(key, {}).setdefault(int(r["active"]), []).append(float(r["idle_us"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise OpgraphError(f"rows[{i}]: needs experts, n, k, active and idle_us as numbers ({exc!r})") from None
    loops = []
    for (experts, n, k), by_active in sorted(by_shape.items()):
        if len(by_active) < 2:
            continue
        xs = sorted(by_active)
        ys = [statistics.median(by_active[a]) for a in xs]
        slope = max(0.0, line_fit(xs, ys)[1])
        first = max(0.0, statistics.fmean(ys) + slope * (1 - statistics.fmean(xs)))
        calls = sum(len(v) for v in by_active.values())
        loops.append(
            FallbackLoop(
                experts=experts, n=n, k=k, first_us=round(first, 2), per_expert_us=round(slope, 3), calls=calls
            )
        )
    return tuple(loops)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hardware.hostfit GRAPH... -o OUT [--device-profile FILE] [--note TEXT]``."""
    parser = argparse.ArgumentParser(prog="python -m hardware.hostfit", description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="+", type=Path, help="graphs captured with --host-timing")
    parser.add_argument("-o", "--output", type=Path, required=True, help="host profile to write (.host.json)")
    parser.add_argument("--device-profile", type=Path, help="device profile whose aten issue time to carry")
    parser.add_argument("--note", action="append", default=[], help="a remark to keep in the profile")
    parser.add_argument(
        "--fallback", type=Path, help="grouped_fallback_host.py result: the _grouped_mm fallback's measured loops"
    )
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
        if args.fallback is not None:
            prof = with_fallback_loops(prof, args.fallback)
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
