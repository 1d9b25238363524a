"""One simulation study: shard if needed, cost, check uncosted ops, run one engine count or sweep several.

The CLI's ``opgraph simulate``, declarative scenarios (``opgraph run``) and benchmarks all go
through :func:`run_study`, so they cannot drift apart. It only calls the public facade of
:mod:`simulators` (``cost_problem``, ``run_problem``, ``sweep_engines``, ``uncosted_error``,
``default_host_us``) and :func:`opgraph.transforms.shard_tensor_parallel`.

>>> from hardware import load_hardware, resolve_cost_model
>>> from opgraph.ir import Gemm, GraphMetadata, OpGraph
>>> graph = OpGraph(metadata=GraphMetadata(model="two gemms"), ops=(Gemm(id=0, m=64, n=64, k=64),
...                 Gemm(id=1, m=64, n=64, k=64)), edges=())
>>> config = study_config(host_mode="none")
>>> study = run_study(graph, load_hardware("h100"), resolve_cost_model("roofline"), config, engines=[1, 2])
>>> study.recommended, sorted(study.results)
(2, [1, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from opgraph.ir import OpGraph, OpKind

if TYPE_CHECKING:
    from hardware import CostModel, HardwareSpec
    from simulators import EngineSweep, SimulationConfig, SimulationResult

__all__ = ["StudyProgress", "StudyResult", "run_study", "shard_for_tp", "study_config"]

StudyProgress = Callable[[int, int], None]
"""Called with the work done and the work in all (ops simulated, or engine counts of a sweep)."""


@dataclass(frozen=True)
class StudyResult:
    """What :func:`run_study` found: one result per engine count, and the one it recommends."""

    graph: OpGraph
    """The graph simulated: the one given, or one rank of it sharded for tensor parallelism."""
    results: dict[int, SimulationResult]
    """The run of each engine count, in the order asked."""
    recommended: int
    """The engine count to show: the only one, or the sweep's recommendation."""
    cost_model_name: str
    """The cost model's name as the simulator reports it."""
    sweep: EngineSweep | None = None
    """The sweep's summary when several counts ran."""
    notes: tuple[str, ...] = ()
    """What the study did to the graph that the user should know (the TP sharding)."""

    @property
    def result(self) -> SimulationResult:
        """The recommended run."""
        return self.results[self.recommended]


_T = TypeVar("_T")


def _pick(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def study_config(
    engines: int = 1,
    *,
    base: SimulationConfig | None = None,
    copy_engines: int = 0,
    links: int = 1,
    policy: str | None = None,
    tp: int | None = None,
    host_mode: str | None = None,
    host_us: float | None = None,
    sync_each_step: bool | None = None,
    framework: bool = True,
    record_host: bool | None = None,
    jitter: float | None = None,
    seed: int | None = None,
    skip_uncosted: bool | None = None,
    independent_engines: bool | None = None,
) -> SimulationConfig:
    """The :class:`~simulators.SimulationConfig` of a study, from the settings the CLI and scenarios name.

    ``base`` (engine groups as data, e.g. from ``--config``) replaces ``copy_engines``/``links``;
    the host's ``sync_ops``/``free_ops`` and ``host_profile`` come from it, and ``framework`` only keeps
    its framework time. A setting left ``None`` is the base's (without a base, the default of
    :class:`~simulators.SimulationConfig`: ``earliest``, tp 1, eager host at the spec's time per op, a
    sync each step, the host track recorded, no jitter, seed 0, uncosted ops an error, engines sharing
    the device); a setting given overrides the base's. ``host_mode="none"`` without ``host_us`` drops
    the base's host time per op (no host, no host time); with a ``host_us`` above 0 it is a
    contradiction that :class:`~simulators.HostConfig` refuses (a pydantic ``ValidationError``, a
    ``ValueError``, whose message is :func:`simulators.host_time_conflict`'s).

    >>> from simulators import SimulationConfig
    >>> base = SimulationConfig.standard(2).model_copy(update={"policy": "critical-path", "tp": 2})
    >>> cfg = study_config(2, base=base, jitter=0.5)
    >>> cfg.policy, cfg.tp, cfg.jitter, study_config().policy
    ('critical-path', 2, 0.5, 'earliest')
    >>> study_config(host_mode="none", host_us=30)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for HostConfig
    per_op_us
      30 us per op has no host to spend it: host mode none issues every op at time zero [...]
    """
    from simulators import HostConfig, HostMode, SimulationConfig

    if base is None:
        base = SimulationConfig.standard(engines, copy_engines=copy_engines, links=links)

    bh = base.host
    mode = HostMode(host_mode) if host_mode is not None else bh.mode
    base_us = None if host_mode is not None and mode is HostMode.NONE else bh.per_op_us
    host = HostConfig(
        mode=mode,
        per_op_us=_pick(host_us, base_us),
        sync_each_step=_pick(sync_each_step, bh.sync_each_step),
        sync_ops=bh.sync_ops,
        free_ops=bh.free_ops,
        framework=framework and bh.framework,
        host_profile=bh.host_profile,
        record=_pick(record_host, bh.record),
    )
    config = base.model_copy(
        update={
            "policy": _pick(policy, base.policy),
            "tp": _pick(tp, base.tp),
            "host": host,
            "jitter": _pick(jitter, base.jitter),
            "seed": _pick(seed, base.seed),
            "skip_uncosted": _pick(skip_uncosted, base.skip_uncosted),
            "independent_engines": _pick(independent_engines, base.independent_engines),
        }
    ).with_engines(engines)
    return SimulationConfig.model_validate(config.model_dump())


def shard_for_tp(graph: OpGraph, tp: int, *, expert_parallel: bool = False) -> tuple[OpGraph, str | None]:
    """One rank of a ``tp``-way run of ``graph`` and a note; the graph as given when it has collectives.

    A graph without collectives is sharded Megatron-style (column/row-parallel linears, heads / tp)
    by :func:`opgraph.transforms.shard_tensor_parallel`, its experts split by expert with
    ``expert_parallel`` (else inside each expert); a graph that has them already is one rank.
    """
    if tp <= 1 or graph.ops_of(OpKind.COLLECTIVE):
        return graph, None
    from opgraph.transforms import shard_tensor_parallel

    sharded = shard_tensor_parallel(graph, tp, expert_parallel=expert_parallel)
    colls = [getattr(o, "collective", None) for o in sharded.ops_of(OpKind.COLLECTIVE)]
    counts = ", ".join(f"{colls.count(c)} {c.value}" for c in dict.fromkeys(colls) if c is not None)
    note = (
        f"graph sharded for tensor parallelism (tp={tp}, Megatron-style: column/row-parallel linears, "
        f"heads / tp; {'experts / tp' if expert_parallel else 'each expert split'}; "
        f"{counts or 'no collectives'} inserted); --no-shard runs it replicated"
    )
    return sharded, note


def run_study(
    graph: OpGraph,
    hardware: HardwareSpec,
    cost_model: CostModel,
    config: SimulationConfig,
    *,
    engines: Sequence[int] | None = None,
    shard: bool = True,
    expert_parallel: bool = False,
    tolerance: float = 0.01,
    progress: StudyProgress | None = None,
) -> StudyResult:
    """Simulate ``graph`` on ``hardware`` with ``cost_model`` for each engine count of ``engines``.

    Shards the graph for ``config.tp`` ranks first when it has no collectives (unless ``shard=False``;
    ``expert_parallel`` splits MoE experts by expert), costs every op once, fails with
    :class:`~simulators.UncostedOpsError` when an op has no cost and ``config.skip_uncosted`` is off,
    then runs the one count (default ``config.engines``) or sweeps them and recommends the smallest
    count within ``tolerance`` of the best makespan. Raises :class:`~opgraph.ir.OpgraphError`
    subclasses on bad input.
    """
    from hardware import cost_warnings
    from simulators import cost_problem, default_host_us, run_problem, sweep_engines, uncosted_error

    counts = list(engines) if engines else [config.engines]
    notes: tuple[str, ...] = ()
    if shard:
        graph, note = shard_for_tp(graph, config.tp, expert_parallel=expert_parallel)
        notes = (note,) if note else ()
    with cost_warnings() as warned:
        problem, model_name, _ = cost_problem(graph, cost_model, hardware)
    notes = (*notes, *warned)
    if problem.uncosted and not config.skip_uncosted:
        raise uncosted_error(problem, model_name)
    config = config.with_engines(counts[0])
    host_us = default_host_us(config, hardware)
    if len(counts) == 1:
        result = run_problem(
            problem,
            config,
            host_per_op_us=host_us,
            hardware_name=hardware.name,
            cost_model_name=model_name,
            progress=progress,
        )
        return StudyResult(graph, {counts[0]: result}, counts[0], model_name, notes=notes)

    def on_point(n: int, _result: SimulationResult) -> None:
        if progress is not None:
            progress(n, counts[-1])

    sweep, results = sweep_engines(
        problem,
        config,
        counts,
        tolerance=tolerance,
        host_per_op_us=host_us,
        hardware_name=hardware.name,
        cost_model_name=model_name,
        on_point=on_point,
    )
    return StudyResult(graph, results, sweep.recommended, model_name, sweep=sweep, notes=notes)
