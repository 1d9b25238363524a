"""Unique op configs of one or many graphs: what replay runs once and counts many times.

A config is an op with its identity stripped: the definition, kind, target, typed fields, the
shapes, dtypes and strides of its tensors, and its recorded aten call, but not its id, scope,
layer, stage or tensor ids. Ops of all graphs that agree on these fold into one :class:`OpConfig`
with a ``count`` of uses and, when a cost estimate is available, their share of the model's op time.

Each config also records which of its inputs are *activations* (:func:`activation_inputs`): tensors
an earlier op of the same graph wrote, so in the model they are still in the L2 cache when the op
runs, while weights and the KV cache carried over from an earlier forward come from DRAM. Replay
with a cold L2 reads these inputs back into L2 before each timed call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hardware.models.profile import writes_through
from opgraph.ir import OpBase, OpCategory, OpGraph, OpKind
from opgraph.ir.configs import config_key as config_key  # re-exported: replay code and tests import it here

if TYPE_CHECKING:
    from hardware.base import CostModel
    from hardware.spec import HardwareSpec

Estimator = Callable[[OpBase], float]
"""Estimated seconds of one call of an op."""


@dataclass
class OpConfig:
    """One unique config: a representative op, how often the model uses it, and its time share."""

    key: str
    """Stable config key (:func:`config_key`)."""
    op: OpBase
    """The first op seen with this config."""
    count: int = 0
    """Uses across all graphs."""
    op_ids: list[int] = field(default_factory=list)
    """Ids of the ops using it (in the graph where they were found, first graph first)."""
    graphs: list[str] = field(default_factory=list)
    """Names of the graphs that use it."""
    est_us: float | None = None
    """Estimated time of one call, microseconds."""
    share: float | None = None
    """Estimated share of the model's op time (count x est over the total), 0..1."""
    warm_inputs: tuple[int, ...] = ()
    """Indices of the op's inputs that are activations at its first use (written by an earlier op of
    the graph, so warm in L2 in the model); see :func:`activation_inputs`."""
    prev_write_bytes: int = 0
    """Bytes the op before it (at its first use) wrote: in the model the last of them are still dirty
    in L2 when this op starts, and it pays for writing them back."""
    warm_reuse_bytes: tuple[int, ...] = ()
    """For each of ``warm_inputs``: bytes the graph's ops moved between the write of that input and
    this read (its reuse distance); an input that far exceeds the L2 size is cold in the model too."""

    @property
    def definition(self) -> str:
        """The op's definition name."""
        return self.op.definition


def graph_label(graph: OpGraph, index: int = 0) -> str:
    """A short name for a graph: model and phase from its metadata, or its position."""
    md = graph.metadata
    name = md.model or f"graph{index}"
    return f"{name}:{md.phase}" if md.phase else name


def activation_inputs(op: OpBase, produced: Mapping[int, int]) -> tuple[int, ...]:
    """Indices of ``op``'s inputs whose tensor id is in ``produced`` (inputs without an id: not produced)."""
    return tuple(i for i, t in enumerate(op.inputs) if t.id is not None and t.id in produced)


class DataFlow:
    """Walks a graph's ops in order, knowing which tensors an earlier op wrote and how long ago.

    Views (free ops) share their base's id and write nothing. An output with the id of one of the
    op's own inputs is an in-place update (a KV-cache write, ``add_``): it keeps the status the
    tensor had (a cache that came in from an earlier forward stays cold after a one-row write) and
    refreshes the write of one that was already an activation. "How long ago" is the reuse
    distance in bytes: the sum of the ``total_bytes`` of the ops in between.
    """

    def __init__(self) -> None:
        self.written_at: dict[int, int] = {}
        """Tensor id to the bytes moved by the graph up to the end of its (last) write."""
        self.traffic = 0
        """Bytes moved by the ops seen so far."""
        self.last_write = 0
        """Bytes the last (non-free) op left dirty in L2: what it wrote, nothing for an op that writes through
        (a GEMM: :func:`hardware.models.profile.writes_through`)."""

    def warm(self, op: OpBase) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``op``'s activation inputs (:func:`activation_inputs`) and their reuse distances, in bytes."""
        idx = activation_inputs(op, self.written_at)
        return idx, tuple(max(self.traffic - self.written_at[op.inputs[i].id or 0], 0) for i in idx)

    def step(self, op: OpBase) -> None:
        """Account for ``op``: its traffic and the tensors it writes."""
        if op.kind in OpCategory.FREE:
            return
        self.traffic += max(int(op.total_bytes), 0)
        self.last_write = 0 if writes_through(op) else sum(t.nbytes for t in op.outputs)
        own = {t.id for t in op.inputs if t.id is not None}
        for t in op.outputs:
            if t.id is None:
                continue
            if t.id not in own or t.id in self.written_at:
                self.written_at[t.id] = self.traffic


def unique_configs(
    graphs: OpGraph | Iterable[OpGraph],
    *,
    estimate: Estimator | None = None,
    include_views: bool = False,
) -> list[OpConfig]:
    """Fold the ops of ``graphs`` into unique configs, most expensive (count x estimate) first.

    Views launch no kernel and are left out unless ``include_views``. ``estimate`` gives the
    seconds of one call of an op (see :func:`cost_estimator`); with it each config gets
    ``est_us`` and ``share``; without it configs keep program order of first use. Each config's
    ``warm_inputs`` are decided by its first use (:func:`activation_inputs`).
    """
    gs = [graphs] if isinstance(graphs, OpGraph) else list(graphs)
    by_key: dict[str, OpConfig] = {}
    for gi, g in enumerate(gs):
        label = graph_label(g, gi)
        flow = DataFlow()
        for op in g.ops:
            if not include_views and op.kind in OpCategory.FREE:
                continue
            key = config_key(op)
            cfg = by_key.get(key)
            if cfg is None:
                warm, reuse = flow.warm(op)
                cfg = by_key[key] = OpConfig(
                    key=key, op=op, warm_inputs=warm, warm_reuse_bytes=reuse, prev_write_bytes=flow.last_write
                )
            flow.step(op)
            cfg.count += 1
            if len(cfg.op_ids) < 64:
                cfg.op_ids.append(op.id)
            if label not in cfg.graphs:
                cfg.graphs.append(label)
    configs = list(by_key.values())
    if estimate is not None:
        for cfg in configs:
            try:
                cfg.est_us = max(0.0, float(estimate(cfg.op))) * 1e6
            except Exception:  # an estimator that cannot cost an op leaves it without a share
                cfg.est_us = None
        total = sum(c.count * (c.est_us or 0.0) for c in configs)
        for cfg in configs:
            if cfg.est_us is not None and total > 0:
                cfg.share = cfg.count * cfg.est_us / total
        configs.sort(key=lambda c: -(c.count * (c.est_us or 0.0)))
    return configs


DEFAULT_ESTIMATE_DEVICE = "h100"
"""The catalog device whose roofline weights configs when replay is given no hardware: shares
depend on ratios of op times, so any current datacenter GPU orders configs about the same."""


def cost_estimator(hw: HardwareSpec | str | None = None, model: CostModel | str | None = None) -> Estimator:
    """Seconds of one call of an op, from a ``hardware`` cost model on a device.

    ``hw`` is a spec or a catalog name (default :data:`DEFAULT_ESTIMATE_DEVICE`); ``model`` a cost
    model or a spec for :func:`hardware.resolve_cost_model` (default ``roofline``). An op the model
    cannot cost falls back to the roofline, and an op with no FLOPs or bytes to cost at all to the
    device's launch latency (it still launches a kernel). Replay uses this only to order configs and
    weight their time shares.

    >>> from opgraph.ir import Gemm
    >>> est = cost_estimator()
    >>> est(Gemm(id=0, m=4096, n=4096, k=4096)) > est(Gemm(id=1, m=16, n=4096, k=4096))
    True
    """
    from hardware import UncostedOpError, load_hardware, resolve_cost_model

    spec = load_hardware(hw or DEFAULT_ESTIMATE_DEVICE) if hw is None or isinstance(hw, str) else hw
    roofline = resolve_cost_model("roofline")
    primary = roofline if model is None else resolve_cost_model(model) if isinstance(model, str) else model
    launch_s = spec.launch_latency_us * 1e-6

    def estimate(op: OpBase) -> float:
        for cost_model in (primary, roofline) if primary is not roofline else (roofline,):
            try:
                return float(cost_model.estimate(op, spec).seconds)
            except UncostedOpError:
                continue
        return launch_s

    return estimate


def roofline_estimator(hw: HardwareSpec | None = None) -> Estimator:
    """Deprecated alias of :func:`cost_estimator` (``hw`` or the default device, roofline model);
    kept until the CLI and benchmarks call :func:`cost_estimator`."""
    return cost_estimator(hw)


def cost_model_estimator(model: CostModel, hw: HardwareSpec) -> Estimator:
    """Deprecated alias of :func:`cost_estimator` (``cost_estimator(hw, model)``)."""
    return cost_estimator(hw, model)


def kinds_filter(kinds: Iterable[str]) -> Callable[[OpConfig], bool]:
    """A predicate keeping configs whose kind is one of ``kinds`` (``gemm``, ``attention``...)."""
    wanted = {OpKind(k) for k in kinds}
    return lambda c: c.op.kind in wanted
