"""The ``CostModel`` protocol, the ``Cost`` it returns, and costing a whole graph with checks."""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hardware.spec import HardwareSpec
from opgraph.ir import IDENTITY_FIELDS, Attention, OpBase, OpCategory, OpGraph, OpgraphError, TensorSpec, eager_parts

# What limits an op's time: the IR's enum, so a cost's verdict is the value saved on simulated spans.
# Re-exported for the cost models (``from hardware.base import Bound``).
from opgraph.ir import Bound as Bound


@dataclass(frozen=True, slots=True)
class Cost:
    """A cost model's estimate for one op on one device."""

    seconds: float
    """Device time of the op."""
    bound: Bound
    """What limits it."""
    compute_s: float = 0.0
    """Time at the achievable compute rate."""
    memory_s: float = 0.0
    """Time at the achievable memory rate."""
    efficiency: float | None = None
    """Fraction of peak the model assumed, when it used one."""
    detail: str = ""
    """How the model got the number (tile shape and waves, table hit, fallback), for reports."""
    host_s: float | None = None
    """Host (framework) time to issue this op, when the model knows it (a calibrated table does);
    ``None`` means the simulator uses the hardware's per-op host overhead."""

    @property
    def us(self) -> float:
        """The time in microseconds."""
        return self.seconds * 1e6


class UncostedOpError(OpgraphError):
    """A cost model cannot cost this op; ``reason`` says why. Reported, never counted as zero."""


class CostModelError(OpgraphError):
    """A cost model failed (raised, returned a negative or non-finite time) on an op."""


class CostModelWarning(UserWarning):
    """A cost model's numbers are not what the user may think they are (the hardware is ignored, a
    table extrapolates far outside what was measured). Front ends print each as one line."""


@contextmanager
def cost_warnings() -> Iterator[list[str]]:
    """Collect the :class:`CostModelWarning` messages raised inside the block, each once, in order.

    Other warnings pass through untouched. A front end prints the collected lines after costing:

    >>> import warnings
    >>> with cost_warnings() as notes:
    ...     warnings.warn("a note", CostModelWarning)
    >>> notes
    ['a note']
    """
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CostModelWarning)
        yield notes
    for w in caught:
        if issubclass(w.category, CostModelWarning):
            text = str(w.message)
            if text not in notes:
                notes.append(text)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


@runtime_checkable
class CostModel(Protocol):
    """Anything with ``estimate(op, hw) -> Cost``. Raise :class:`UncostedOpError` for ops you cannot cost."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The cost of ``op`` on ``hw``."""
        ...


@runtime_checkable
class WritebackModel(Protocol):
    """A cost model that also prices what an op pays for the dirty L2 lines the op before it left.

    :func:`cost_graph` asks it about each op after another, in graph order (one stream's order):
    ``after_write(op, cost, before, hw)`` returns ``cost`` with the charge added.
    """

    def after_write(self, op: OpBase, cost: Cost, before: OpBase, hw: HardwareSpec) -> Cost:
        """``cost`` of ``op`` run right after ``before``."""
        ...


@dataclass
class GraphCosts:
    """Costs of every op of a graph, and the ops that could not be costed with the reason."""

    costs: dict[int, Cost] = field(default_factory=dict)
    """Cost per op id."""
    uncosted: dict[int, str] = field(default_factory=dict)
    """Ops no model could cost, by id, with the cost model's reason."""
    unique_configs: int = 0
    """Distinct op configurations the cost model was asked about (every op with the cache off)."""
    from_fallback: int = 0
    """Of those, the configurations the cost model declined and the fallback model costed."""

    @property
    def total_seconds(self) -> float:
        """Sum of costed op times (uncosted ops are excluded, and listed in ``uncosted``)."""
        return sum(c.seconds for c in self.costs.values())


#: Fields that do not change what an op costs .
_NOT_COST: frozenset[str] = IDENTITY_FIELDS | {"inputs", "outputs", "target"}
"""Fields that do not change what an op costs (where it sits, its tensors)."""
_getters: dict[type[OpBase], Callable[[OpBase], tuple[object, ...]]] = {}


def _key_getter(cls: type[OpBase]) -> Callable[[OpBase], tuple[object, ...]]:
    getter = _getters.get(cls)
    if getter is None:
        names = [n for n in cls.model_fields if n not in _NOT_COST]
        get = operator.itemgetter(*names)

        def getter(op: OpBase, _get: Callable[[dict[str, object]], object] = get) -> tuple[object, ...]:
            v = _get(op.__dict__)
            return v if isinstance(v, tuple) else (v,)

        _getters[cls] = getter
    return getter


def _layouts(tensors: tuple[TensorSpec, ...]) -> tuple[tuple[object, ...], ...]:
    return tuple((t.shape, t.strides, t.dtype) for t in tensors)


def cost_key(op: OpBase) -> Hashable:
    """A hashable key equal for ops whose cost-relevant fields and tensor layouts are equal.

    The layouts (shape, strides, dtype of each recorded tensor, not its id) are part of the key: a cost
    model may price a copy out of a strided view apart from a contiguous one of the same fields (a
    decode's KV-cache write of a key made contiguous by a ``cat`` and of a value that is a slice of the
    fused projection, 4-5x as long).

    >>> from opgraph.ir import Memory, TensorSpec
    >>> dense = TensorSpec(shape=(2, 4), dtype="bf16")
    >>> strided = TensorSpec(shape=(2, 4), dtype="bf16", strides=(12, 1))
    >>> a, b = (Memory(id=i, fn="copy", numel=8, inputs=(t,)) for i, t in enumerate((dense, strided)))
    >>> cost_key(a) == cost_key(a.model_copy(update={"id": 5})), cost_key(a) == cost_key(b)
    (True, False)
    """
    cls = type(op)
    key = (cls, (_getters.get(cls) or _key_getter(cls))(op), _layouts(op.inputs), _layouts(op.outputs))
    try:
        hash(key)
    except TypeError:  # an unhashable field value (the recorded aten call): key on its repr
        return (cls, tuple(_hashable(v) for v in key[1]), key[2], key[3])
    return key


def _hashable(value: object) -> object:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def check_cost(cost: object, op: OpBase, model_name: str) -> Cost:
    """Validate what a cost model returned for ``op``; raise :class:`CostModelError` naming the op."""
    where = f"op {op.id} ({op.definition})"
    if not isinstance(cost, Cost):
        raise CostModelError(f"cost model {model_name} returned {type(cost).__name__}, not a Cost", where=where)
    if not math.isfinite(cost.seconds) or cost.seconds < 0:
        raise CostModelError(f"cost model {model_name} returned an invalid time {cost.seconds!r} s", where=where)
    return cost


def sum_of_parts(parts: Sequence[tuple[OpBase, Cost]], what: str) -> Cost:
    """One op's cost as the sum of the kernels it runs one after another (``what`` names them): time,
    compute and memory times add up, the longest part says what bounds it, and the host issues every
    part (its time is known when every part's is)."""
    longest = max(parts, key=lambda pc: pc[1].seconds)[1]
    hosts = [c.host_s for _, c in parts]
    listed = ", ".join(f"{p.definition} {c.us:.1f} us" for p, c in parts)
    extrapolated = any("extrapolated" in c.detail for _, c in parts)
    return Cost(
        seconds=sum(c.seconds for _, c in parts),
        bound=longest.bound,
        compute_s=sum(c.compute_s for _, c in parts),
        memory_s=sum(c.memory_s for _, c in parts),
        detail=f"{what}, {len(parts)} kernels: {listed}" + (" (extrapolated parts)" if extrapolated else ""),
        host_s=None if any(h is None for h in hosts) else sum(h for h in hosts if h is not None),
    )


def eager_attention_cost(model: CostModel, op: OpBase, hw: HardwareSpec) -> Cost | None:
    """Eager attention (:attr:`~opgraph.ir.Attention.eager`) priced kernel by kernel by ``model``
    (:func:`~opgraph.ir.eager_parts`: no fused attention kernel runs it); ``None`` for any other op. The
    models that price ops from their fields call it first; a table that measured the op itself answers
    from its measurement, and asks its fallback (which calls it) otherwise."""
    parts = eager_parts(op) if isinstance(op, Attention) else ()
    if not parts:
        return None
    name = type(model).__name__
    return sum_of_parts([(p, check_cost(model.estimate(p, hw), p, name)) for p in parts], "eager attention")


def estimate_op(model: CostModel, op: OpBase, hw: HardwareSpec, model_name: str) -> Cost | str:
    """``model``'s checked :class:`Cost` for ``op``, or the reason it declined the op
    (:class:`UncostedOpError`); anything else it raises becomes a :class:`CostModelError` naming the op."""
    try:
        return check_cost(model.estimate(op, hw), op, model_name)
    except UncostedOpError as exc:
        return exc.message
    except OpgraphError:
        raise
    except Exception as exc:
        raise CostModelError(
            f"cost model {model_name} raised {type(exc).__name__}: {exc}", where=f"op {op.id} ({op.definition})"
        ) from exc


def cost_graph(
    graph: OpGraph, model: CostModel, hw: HardwareSpec, *, cache: bool = True, fallback: CostModel | None = None
) -> GraphCosts:
    """Cost every op; ops the model declines go to ``uncosted``, failures raise :class:`CostModelError`.

    A :class:`WritebackModel` also charges each op for what the op before it (in graph order) left
    dirty in L2.

    Ops with equal cost-relevant fields and tensor layouts (:func:`cost_key`) are costed once when ``cache``
    is on. ``fallback`` is asked
    about the ops ``model`` declines (the simulator passes the collective model, so a compute-only
    model still gets its collectives costed); an op both decline keeps ``model``'s reason.

    Examples
    --------
    >>> from opgraph.ir import Collective, CollectiveKind, Elementwise, OpGraph
    >>> from hardware import AlphaBetaCollectiveModel, load_hardware, resolve_cost_model
    >>> ops = (Elementwise(id=0, fn="add", numel=8), Elementwise(id=1, fn="add", numel=8),
    ...        Collective(id=2, collective=CollectiveKind.ALL_REDUCE, bytes=4096, group_size=2))
    >>> costs = cost_graph(OpGraph(ops=ops), resolve_cost_model("roofline"), load_hardware("h100"))
    >>> sorted(costs.costs), costs.unique_configs
    ([0, 1, 2], 2)
    """
    name = type(model).__name__
    fallback_name = type(fallback).__name__
    out = GraphCosts()
    memo: dict[Hashable, tuple[Cost | str, bool]] = {}
    charge = model if isinstance(model, WritebackModel) else None
    before: OpBase | None = None
    for op in graph.ops:
        key = cost_key(op) if cache else None
        hit, own = memo.get(key, (None, True)) if cache else (None, True)
        if hit is None:
            out.unique_configs += 1
            hit = estimate_op(model, op, hw, name)
            if isinstance(hit, str) and fallback is not None:
                second = estimate_op(fallback, op, hw, fallback_name)
                if isinstance(second, Cost):
                    hit, own = second, False
                    out.from_fallback += 1
            if cache:
                memo[key] = (hit, own)
        if isinstance(hit, Cost):
            if charge is not None and own and before is not None and op.kind not in OpCategory.FREE:
                hit = charge.after_write(op, hit, before, hw)
            out.costs[op.id] = hit
        else:
            out.uncosted[op.id] = hit
        if op.kind not in OpCategory.FREE:
            before = op
    return out


def peak_times(op: OpBase, hw: HardwareSpec) -> tuple[float, float]:
    """``(compute_s, memory_s)``: ``op``'s FLOPs at ``hw``'s peak rate and its bytes at the full
    memory bandwidth, in seconds.

    No kernel of ``op`` can be shorter than either. While ``op`` runs for ``d`` seconds it uses the
    fraction ``compute_s / d`` of the device's compute and ``memory_s / d`` of its memory bandwidth;
    the simulator shares the device among ops running at once by these fractions. Matrix kinds
    (GEMM, attention) count against the tensor units' peak for their dtype, the rest against the
    vector units'. Collectives (links) and views (no kernel) take nothing of the device, and a spec
    that names no FLOP/s at all says nothing of compute (``compute_s`` is 0).

    Examples
    --------
    >>> from opgraph.ir import Gemm
    >>> from hardware.spec import HardwareSpec, PeakFlops
    >>> hw = HardwareSpec(name="x", memory_bytes=1e9, memory_bandwidth=1e12, tensor=PeakFlops(bf16=1e15))
    >>> gemm = Gemm(id=0, m=1000, n=1000, k=1000)
    >>> [round(t * 1e6, 3) for t in peak_times(gemm, hw)]
    [2.0, 6.0]
    """
    kind = op.kind
    if kind in OpCategory.COMMUNICATION or kind in OpCategory.FREE:
        return 0.0, 0.0
    rated = any(hw.tensor.model_dump().values()) or any(hw.vector.model_dump().values())
    if op.flops and rated:
        compute = op.flops / hw.peak_flops(op.dtype, tensor=kind in OpCategory.MATMUL)
    else:
        compute = 0.0
    return compute, (op.bytes_read + op.bytes_written) / hw.memory_bandwidth
