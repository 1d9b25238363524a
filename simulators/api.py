"""Entry points: :func:`simulate` a graph on hardware with a cost model, or :func:`run_problem` on
given durations, and :func:`sweep_engines` over compute-engine counts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

from hardware.base import CostModel, cost_graph
from hardware.hostprofile import (
    HostProfile,
    check_host_cpu,
    fallback_issue_us,
    hardware_host_profile,
    in_context,
    in_generate_loop,
    load_host_profile,
    predict_gaps,
)
from hardware.models.collective import AlphaBetaCollectiveModel
from hardware.spec import HardwareSpec
from opgraph.ir import OpGraph, OpgraphError, host_syncs, is_nested
from opgraph.ir.gcpause import paused_gc
from simulators.config import HostMode, SimulationConfig
from simulators.errors import SimulationConfigError, UncostedOpsError
from simulators.kernel import Simulator
from simulators.policies import get_policy
from simulators.problem import SchedulingProblem
from simulators.result import SimulationResult
from simulators.stats import EngineSweep, SweepPoint

Progress = Callable[[int, int], None]

HOST_PROFILE_COST_MODELS = frozenset({"ProfileModel"})
"""Cost models (by class name) whose eager runs take the framework time of the host profile the
device's catalog entry names (``host_profile = ...``) by default: the measured device profile it ships
beside. Others (the datasheet roofline, calibrated tables, users' models) take it only when
``HostConfig.host_profile`` names a file."""


def default_host_us(config: SimulationConfig, hardware: HardwareSpec | None) -> float:
    """Host time per op: the configured value, else the spec's for the host mode (0 for ``none``)."""
    host = config.host
    if host.per_op_us is not None:
        return host.per_op_us
    if host.mode is HostMode.NONE or hardware is None:
        return 0.0
    return hardware.host.eager_us if host.mode is HostMode.EAGER else hardware.host.cuda_graph_us


def uncosted_error(problem: SchedulingProblem, model_name: str) -> UncostedOpsError:
    """The one-line error listing uncosted ops: count, kinds, and the first few with their reasons."""
    unc = problem.uncosted
    kinds = Counter(u.kind for u in unc)
    kind_text = ", ".join(f"{k}×{c}" for k, c in kinds.most_common())
    shown = "; ".join(f"op {u.op_id} {u.definition}: {u.reason}" for u in unc[:3])
    more = f"; +{len(unc) - 3} more" if len(unc) > 3 else ""
    return UncostedOpsError(
        f"{len(unc)} op(s) cannot be costed by {model_name or 'the cost model'} ({kind_text}): {shown}{more}",
        hint="use a cost model that covers them, or --skip-uncosted to simulate them as free and list them",
    )


def run_problem(
    problem: SchedulingProblem,
    config: SimulationConfig | None = None,
    *,
    host_per_op_us: float | None = None,
    hardware_name: str = "",
    cost_model_name: str = "",
    progress: Progress | None = None,
) -> SimulationResult:
    """Schedule a prepared problem. Uncosted ops in it fail unless ``config.skip_uncosted``.

    ``host_per_op_us`` defaults to ``config.host.per_op_us`` (0 when that is unset).
    """
    config = config or SimulationConfig()
    if host_per_op_us is None:
        host_per_op_us = config.host.per_op_us or 0.0
    if problem.uncosted and not config.skip_uncosted:
        raise uncosted_error(problem, cost_model_name)
    policy = get_policy(config.policy)
    uncosted = {u.index for u in problem.uncosted}
    charge_free = config.host.free_ops
    free = problem.free
    host_us = [host_per_op_us if (charge_free or not free[i] or i in uncosted) else 0.0 for i in range(len(problem))]
    notes: list[str] = []
    if config.host.mode is HostMode.EAGER and problem.host_us and config.host.per_op_us is None:
        # A calibrated cost model knows each op's measured eager issue time: it wins over the per-op
        # default, but not over a per-op time the user gave (``HostConfig.per_op_us``, ``--host-us``).
        host_us = [h if (m is None or h == 0.0) else m for h, m in zip(host_us, problem.host_us, strict=True)]
        own = sum(1 for h, m in zip(host_us, problem.host_us, strict=True) if m is not None and h == m)
        # Ops charged host time that the cost model has no issue time for take the per-op default.
        fall_back = sum(1 for h, m in zip(host_us, problem.host_us, strict=True) if h > 0 and (m is None or h != m))
    else:
        own = fall_back = 0
    marked = _waits_before(problem.graph) if config.host.mode is HostMode.EAGER else ()
    if marked and not set(marked) <= set(config.host.sync_ops):
        # The real run's host waits for the device before these ops' kernels (torch's _grouped_mm fallback
        # copies its offsets to the host first): the graph marks them at capture; the host waits for the
        # op issued before each.
        host = config.host.model_copy(update={"sync_ops": tuple(sorted({*config.host.sync_ops, *marked}))})
        config = config.model_copy(update={"host": host})
    if config.host.mode is HostMode.EAGER and config.host.framework:
        host_us, host_per_op_us = _add_framework_time(
            problem, config, host_us, host_per_op_us, hardware_name, cost_model_name, notes
        )
    if own:
        model = f"the cost model {cost_model_name}" if cost_model_name else "the cost model"
        notes.insert(
            0,
            f"host: {own} of {len(host_us)} ops take their eager issue time from {model} (measured per aten "
            "call)"
            + (f", the other {fall_back} op(s) {host_per_op_us:g} us each" if fall_back else "")
            + "; --host-us sets one time for every op",
        )
    with paused_gc():
        sim = Simulator(problem, config, policy, host_us, progress=progress)
        kernel = sim.run()
    return SimulationResult(
        problem=problem,
        config=config,
        kernel=kernel,
        policy_name=policy.name or type(policy).__name__,
        host_per_op_us=host_per_op_us,
        hardware_name=hardware_name,
        cost_model_name=cost_model_name,
        notes=[*notes, *kernel.notes],
    )


def _add_framework_time(
    problem: SchedulingProblem,
    config: SimulationConfig,
    host_us: list[float],
    per_op_us: float,
    hardware_name: str,
    cost_model_name: str,
    notes: list[str],
) -> tuple[list[float], float]:
    """Eager host time per op plus the framework's time before it, by precedence: the graph's own
    (captured with ``--host-timing``), else the host profile's prediction (``config.host.host_profile``,
    else, when the cost model is one of :data:`HOST_PROFILE_COST_MODELS`, the host profile the hardware
    names), else none; and the default issue time per op (the host profile's, unless
    ``config.host.per_op_us`` is set). An op that runs nested in the aten call before it
    (:func:`~hardware.hostprofile.is_nested`) takes none: what ``--host-timing`` measured before it on
    ``meta`` is Python that emulates a C++ loop. Says which in ``notes``."""
    if any(problem.framework_us):
        timing = problem.graph.metadata.host_timing
        cpu = timing.cpu if timing else "the capture host"
        own = [0.0 if is_nested(op) else f for op, f in zip(problem.ops, problem.framework_us, strict=True)]
        notes.append(
            f"host: {sum(own) / 1e3:.3f} ms of framework time between ops, measured on {cpu} "
            "(the graph's --host-timing)"
        )
        return [h + f for h, f in zip(host_us, own, strict=True)], per_op_us
    # The device's shipped host profile goes with its shipped device profile; other cost models (the
    # datasheet roofline, a calibrated table, a user's model) keep the spec's host unless asked.
    shipped = cost_model_name in HOST_PROFILE_COST_MODELS
    found = host_profile_for(config.host.host_profile, hardware_name if shipped else "")
    if found is None:
        return host_us, per_op_us
    profile, where = found
    warned = check_host_cpu(profile, hardware_name, where)
    if warned:
        notes.append(f"warning: {warned}")
    if config.host.per_op_us is None and profile.issue_us is not None:
        # The profile's issue time per aten call replaces the spec's typical value; a calibrated or
        # profiled cost model's own per-op issue times still win (problem.host_us), on the host
        # profile's footing (:func:`issue_scale`).
        per_op_us = profile.issue_us
        measured = problem.host_us or [None] * len(host_us)
        scale, note = issue_scale(profile, problem.issue_basis)
        if note and any(m is not None for m in measured):
            notes.append(note)
        host_us = [
            per_op_us if h > 0.0 and m is None else (h * scale if m is not None and h == m else h)
            for h, m in zip(host_us, measured, strict=True)
        ]
    if config.host.per_op_us is None and profile.grouped_fallback:
        # The products of torch's _grouped_mm fallback: the loop this CPU was measured running.
        loops = [
            fallback_issue_us(profile, op) if h > 0.0 else None for op, h in zip(problem.ops, host_us, strict=True)
        ]
        if any(x is not None for x in loops):
            host_us = [h if x is None else x for h, x in zip(host_us, loops, strict=True)]
            calls = sum(1 for op, x in zip(problem.ops, loops, strict=True) if x is not None and not is_nested(op))
            notes.append(
                f"host: {sum(1 for x in loops if x is not None)} expert products of {calls} _grouped_mm fallback "
                f"call(s) take the loop {where} measured (the call with its first expert, then each further one)"
            )
    predicted = predict_gaps(problem.graph, profile)
    notes.append(
        f"host: {predicted.total_us / 1e3:.3f} ms of framework time between ops predicted by the host profile "
        f"{where} ({profile.host.cpu}; ops by key: {predicted.describe()}); a graph captured with --host-timing "
        "uses its own, --no-framework-time drops it"
    )
    total = [h + f for h, f in zip(host_us, predicted.gaps_us, strict=True)]
    in_context_terms = (
        profile.op_scale != 1.0 or profile.forward_us or profile.busy_scale or profile.nested_scale != 1.0
    )
    if problem.graph.metadata.phase == "generate":
        # The in-context terms were fitted on walls of forward passes called on their own (a fresh cache,
        # a sync after each); generate's loop runs its steps warm, back to back: its own terms apply.
        if in_context_terms:
            notes.append(
                "host: the host profile's in-context terms (fitted on walls of single forward passes) are not "
                "applied to the steps of a generation"
            )
        if profile.generate_step_us or profile.generate_setup_us:
            notes.append(
                f"host: generate's loop (fitted from measured generates): {profile.generate_step_us / 1e3:.3f} ms "
                f"more per step, {profile.generate_setup_us / 1e3:.3f} ms before the prompt's forward pass"
            )
            total = in_generate_loop(total, problem.graph, profile)
    elif in_context_terms:
        busy = f", x(1 + {profile.busy_scale:.3f} x the device's busy share)" if profile.busy_scale else ""
        nested = (
            f"; calls issued from C++ inside another (nested) x{profile.nested_scale:.3f}"
            if profile.nested_scale != 1.0 and any(is_nested(op) for op in problem.graph.ops)
            else ""
        )
        notes.append(
            f"host: in context on the device (fitted from measured walls): each op's host time "
            f"x{profile.op_scale:.3f}{busy}, {profile.forward_us / 1e3:.3f} ms more per forward pass{nested}"
        )
        total = in_context(total, problem.graph, profile, problem.dur_us)
    return total, per_op_us


def _waits_before(graph: OpGraph) -> tuple[int, ...]:
    """Ids of the ops after which an eager host waits for the device because the op after them is a host
    sync (:func:`~opgraph.ir.host_syncs`: its call copies device data to the host before it launches)."""
    marked = set(host_syncs(graph))
    ops = graph.ops
    return tuple(ops[i - 1].id for i in range(1, len(ops)) if ops[i].id in marked)


def issue_scale(host: HostProfile, basis: tuple[float, str] | None) -> tuple[float, str]:
    """The factor that puts a device profile's per-op issue times on the host profile's footing, and a
    note saying so (``(1.0, "")`` when none is needed).

    Both profiles measure the host's issue time per aten call (``aten_issue_us`` in the device profile's
    sweep, :attr:`HostProfile.issue_us`); a host profile's in-context terms were fitted with the issue
    times of one device profile (:attr:`HostProfile.issue_source`). Another sweep may have met the same
    CPU model at another speed (a shared machine's host drifts): its per-op times are scaled by the ratio
    of the two calibrations, so they describe the host the host profile describes. ``basis``: the issue
    time per aten call of the profile that priced the ops and its file name
    (:attr:`SchedulingProblem.issue_basis`, from the cost model); ``None`` when unknown."""
    if host.issue_us is None or basis is None:
        return 1.0, ""
    device_us, name = basis
    if not device_us or math.isclose(device_us, host.issue_us, rel_tol=1e-9):
        return 1.0, ""
    scale = host.issue_us / device_us
    note = (
        f"host: per-op issue times of {name} (its sweep met the host at {device_us:.2f} us per aten call) "
        f"x{scale:.3f}, to the host profile's {host.issue_us:.2f} us ({host.issue_source})"
    )
    return scale, note


def host_profile_for(path: str | None, hardware_name: str) -> tuple[HostProfile, str] | None:
    """The host profile to use: the file ``path``, else the one the device ``hardware_name`` names in
    the catalog, else ``None``; with the name to show for it."""
    if path is None:
        if not hardware_name:
            return None
        try:
            named = hardware_host_profile(hardware_name)
        except OpgraphError:  # a device not in the catalog (a user file): it names none
            return None
        if named is None:
            return None
        return _load_cached(str(named), _mtime(named)), named.name
    return _load_cached(path, _mtime(Path(path))), path


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0  # load_host_profile says what is wrong


@lru_cache(maxsize=8)
def _load_cached(path: str, _mtime_ns: int) -> HostProfile:
    return load_host_profile(path)


def cost_problem(graph: OpGraph, cost_model: CostModel, hardware: HardwareSpec) -> tuple[SchedulingProblem, str, int]:
    """Cost ``graph`` and flatten it: (problem, cost model name, unique configurations costed).

    Collectives the cost model declines are costed by the one collective formula
    (:class:`~hardware.models.collective.AlphaBetaCollectiveModel`) from the spec's interconnect.
    """
    with paused_gc():
        costs = cost_graph(graph, cost_model, hardware, fallback=AlphaBetaCollectiveModel())
        problem = SchedulingProblem.from_costs(graph, costs.costs, costs.uncosted, hardware=hardware)
    basis = getattr(cost_model, "issue_basis", None)  # a measured profile's footing (ProfileModel)
    if callable(basis):
        problem.issue_basis = basis(hardware)
    return problem, type(cost_model).__name__, costs.unique_configs


def simulate(
    graph: OpGraph,
    hardware: HardwareSpec,
    cost_model: CostModel,
    config: SimulationConfig | None = None,
    *,
    progress: Progress | None = None,
) -> SimulationResult:
    """Cost ``graph`` with ``cost_model`` on ``hardware`` and schedule it under ``config``.

    Raises :class:`~opgraph.ir.CycleError` for a cyclic graph and
    :class:`~simulators.errors.UncostedOpsError` when ops cannot be costed (unless
    ``config.skip_uncosted``).
    """
    config = config or SimulationConfig()
    problem, model_name, _ = cost_problem(graph, cost_model, hardware)
    return run_problem(
        problem,
        config,
        host_per_op_us=default_host_us(config, hardware),
        hardware_name=hardware.name,
        cost_model_name=model_name,
        progress=progress,
    )


def sweep_engines(
    problem: SchedulingProblem,
    config: SimulationConfig,
    counts: Iterable[int],
    *,
    tolerance: float = 0.01,
    host_per_op_us: float | None = None,
    hardware_name: str = "",
    cost_model_name: str = "",
    on_point: Callable[[int, SimulationResult], None] | None = None,
) -> tuple[EngineSweep, dict[int, SimulationResult]]:
    """Run ``problem`` with each compute-engine count; name the smallest count within ``tolerance`` of the best."""
    counts = sorted(set(counts))
    if not counts or counts[0] < 1:
        raise SimulationConfigError("engine counts must be 1 or more", where="--engines")
    results: dict[int, SimulationResult] = {}
    points: list[SweepPoint] = []
    for n in counts:
        res = run_problem(
            problem,
            config.with_engines(n),
            host_per_op_us=host_per_op_us,
            hardware_name=hardware_name,
            cost_model_name=cost_model_name,
        )
        results[n] = res
        st = res.stats()
        comp = [e for e in st.engines if e.group == config.compute_group.name and e.rank == 0]
        util = sum(e.utilization for e in comp) / len(comp) if comp else 0.0
        points.append(SweepPoint(engines=n, makespan_us=st.makespan_us, speedup=st.speedup, utilization=util))
        if on_point is not None:
            on_point(n, res)
    best = min(p.makespan_us for p in points)
    recommended = next(p.engines for p in points if p.makespan_us <= best * (1 + tolerance))
    cp = results[counts[0]].stats().critical_path.length_us
    return (
        EngineSweep(
            points=tuple(points),
            best_makespan_us=best,
            tolerance=tolerance,
            recommended=recommended,
            critical_path_us=cp,
        ),
        results,
    )
