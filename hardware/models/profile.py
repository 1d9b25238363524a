"""The profile cost model: a measured device profile's efficiency, interpolated, times the roofline.

Each measured point of a :class:`~hardware.profile.DeviceProfile` gives an *efficiency*: the
datasheet roofline time of its op (``max(FLOPs / peak, bytes / bandwidth)`` on this device, tensor
peak for GEMMs and attention) over its measured time, the fraction of the roofline it achieved.
An op is predicted as ``roofline / efficiency``, the efficiency found among the points of its
*regime* (:func:`profile_features`: GEMM, grouped expert GEMM, attention decode or prefill, a norm,
a copy...) and dtype (a single expert product of an experts loop is in the expert-loop regime, not
the dense GEMM one):

- along the regime's size axis (``log2 m`` for GEMMs, ``log2 pairs`` for ``batched_mm`` expert GEMMs,
  ``log2 kv_len`` for a decode, ``log2 q_len`` for a prefill, ``log2 bytes`` for memory-bound kinds and
  for an expert loop's products, whose shape is their rows per expert) piecewise-linear in
  ``log(efficiency)`` between the measured sizes of one shape;
- across shapes (``log2 n, log2 k`` of a GEMM; batch, heads, head size and GQA ratio of attention)
  inverse-distance weighted over the nearest measured shapes; off the GEMM ``m`` axis a neighbour's
  efficiency is carried to the op's roofline as its measured time follows the roofline along its
  size axis (a latency-bound neighbour lends its time, a bandwidth-bound one its efficiency);
- a memory-bound op also sees the shapes only a twin dtype measured (:func:`twin_dtypes`: fp16 and
  bf16), where its own dtype's sweep is sparse.

transformers' ``batched_mm`` expert GEMMs (one ``bmm`` of the token-expert pairs' gathered weight
copies) have a regime of their own (:data:`BATCHED_MM`, along ``log2 pairs``); a profile measured before
it had one prices them as it did then (:attr:`Features.fallback`), and says so.

An expert GEMM is a :class:`~opgraph.ir.Gemm` whose ``expert`` field is set: its regime, experts and
top-k come from that field (:class:`~opgraph.ir.ExpertGemm`, :func:`~opgraph.ir.experts.grouped_kernel`),
never from its definition, which only names it.

A ``_grouped_mm`` expert GEMM pays whole row tiles of torch's grouped kernel (:data:`TILE_ROWS`) for
the uneven loads a router deals, where the profile measured even ones (:func:`row_tiles_factor`): the
roofline's compute term grows with the tiles (padded rows are MMA work), its memory term stays.

Past the largest measured size the efficiency stays that of the edge, so the roofline carries the
op across a regime boundary (a GEMM measured at decode sizes is never scaled by FLOPs into a
prefill); under the smallest measured bytes the smallest point's time stays (a kernel that small
is latency-bound). Such costs say "extrapolated" in their detail; beyond
:data:`FAR` times the sweep's range a :class:`ProfileExtrapolationWarning` says so once per model.
Outside the sweep no op is predicted below the profile's launch floor (an empty kernel). Kinds
the profile did not measure go to the datasheet roofline, and say so. The host time to issue an
op (``Cost.host_s``) is the median measured for its regime, else its kind, else the profile's
time per aten call, each as the host issued it at its fastest (:meth:`DeviceProfile.issue_s`).

The sweep flushes the L2 by reading before each point, so a point never pays for writing back what the
kernel before it left dirty, as an op in a model does. The profile's ``writeback`` points (one op of each
kind after a write of 0-64 MiB) price that: :meth:`ProfileModel.after_write`, which
:func:`~hardware.base.cost_graph` calls for each op after the one before it in graph order, adds to a
memory-bound op its kind's penalty at the dirty bytes it evicts (:func:`evicted_dirty_bytes`; a GEMM's output
counts as clean). ``writeback=false`` turns it off.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hardware.base import Bound, Cost, CostModel, CostModelError, CostModelWarning, eager_attention_cost
from hardware.models.options import flag
from hardware.profile import DeviceProfile, ProfilePoint, hardware_profile, load_profile
from hardware.spec import HardwareSpec
from opgraph.ir import (
    Activation,
    Attention,
    DType,
    Elementwise,
    Embedding,
    ExpertsImpl,
    Gemm,
    Memory,
    MoeRouting,
    Norm,
    OpBase,
    OpCategory,
    OpKind,
    Reduction,
    Rope,
    Softmax,
    TensorSpec,
    TopK,
)
from opgraph.ir.configs import is_contiguous
from opgraph.ir.experts import grouped_kernel

FAR = 2.0
"""Log2 distance (4x) past the sweep's range, or from the nearest measured shape in any shape
feature, beyond which :class:`ProfileExtrapolationWarning` is raised."""
NEIGHBOURS = 4
"""Measured shapes an interpolation weighs at most."""

_DTYPE_FALLBACK: dict[DType, tuple[DType, ...]] = {
    DType.bf16: (DType.fp16, DType.fp32),
    DType.fp16: (DType.bf16, DType.fp32),
    DType.fp32: (DType.bf16, DType.fp16),
}


class ProfileExtrapolationWarning(CostModelWarning):
    """The profile model predicts an op far outside what the sweep measured (see :data:`FAR`)."""


class ProfileWritebackWarning(CostModelWarning):
    """The profile has no ``writeback`` points, so no op is charged for the L2 lines the op before left dirty."""


@dataclass(frozen=True)
class Features:
    """Where an op sits in a profile: its regime, size axis (log2) and shape features (log2)."""

    regime: str
    """``gemm``, ``gemm:grouped:bmm``, ``attention:decode``, ``norm:rms``...: points of one regime only
    are interpolated together."""
    axis: str
    """Name of the size axis (``m``, ``kv_len``, ``q_len``, ``bytes``)."""
    size: float
    """log2 of the size."""
    shape: tuple[float, ...] = ()
    """log2 of the shape features."""
    shape_names: tuple[str, ...] = ()
    """Their names."""
    products: int = 1
    """How many like products the op runs (an expert-loop point: one per expert): its size and, where a
    neighbour's efficiency is carried to another shape, its roofline count one of them."""
    fallback: Features | None = None
    """Where the op is placed in a profile that measured no point of ``regime`` (in any dtype), before any
    sibling regime: the regime and features it was priced from before ``regime`` was swept (``None``: the
    nearest implementation or a sibling, as :meth:`_Index.find` picks)."""

    @property
    def family(self) -> str:
        """The op kind part of the regime (what a missing regime falls back to)."""
        return self.regime.split(":", 1)[0]

    def label(self) -> str:
        """The shape as ``n=4096,k=4096``."""
        return ",".join(f"{n}={2**v:.4g}" for n, v in zip(self.shape_names, self.shape, strict=True))


GROUPED_MM = "gemm:grouped:grouped_mm"
"""The regime of ``_grouped_mm`` expert GEMMs (torch's grouped kernel)."""
GROUPED_BMM = "gemm:grouped:bmm"
"""The regime of batched expert GEMMs ``[experts, m, k] @ [experts, k, n]`` (one bmm over the experts)."""
EXPERT_LOOP = "gemm:grouped:loop"
"""The regime of the eager experts loop's products (one GEMM per expert, each expert's weights cold)."""
BATCHED_MM = "gemm:grouped:batched_mm"
"""The regime of transformers' ``batched_mm`` expert GEMMs: one ``bmm`` of ``pairs`` products, each a
token against its expert's gathered weight copy (``[n, k] @ [k, 1]``), along ``log2 pairs`` over the
shapes ``(n, k)`` (the sweep's ``moe.*.batched_mm`` series)."""

_NEAREST_REGIME: dict[str, tuple[str, ...]] = {
    GROUPED_MM: (GROUPED_BMM,),
    GROUPED_BMM: (GROUPED_MM,),
}
"""Regimes to try, in order, before any other of the same kind when a profile lacks one."""
UNARY_ACTIVATION = "activation:silu"
"""Where an ungated activation the profile did not measure is priced from: one input read, one output
written, as any such activation's kernel (not a gated one's two inputs or a strided variant's)."""


def _nearest_regimes(regime: str) -> tuple[str, ...]:
    if regime in _NEAREST_REGIME:
        return _NEAREST_REGIME[regime]
    if regime.startswith("activation:") and not regime.endswith(("glu", ":gated")):
        return (UNARY_ACTIVATION,)
    return ()


def _lg(x: float) -> float:
    return math.log2(max(float(x), 1.0))


def is_batched_mm(op: Gemm) -> bool:
    """Whether ``op`` is an expert GEMM of transformers' ``batched_mm`` experts (its ``expert`` field
    says so; the replay recipe's test, ``validators.recipes.gemm.is_batched_mm``, on ungrouped GEMMs).

    >>> from opgraph.ir import ExpertGemm
    >>> expert = ExpertGemm(impl="batched_mm", experts=4, top_k=2, part="gate_up")
    >>> is_batched_mm(Gemm(id=0, m=1, n=8, k=4, batch=6, target="moe_experts_gate_up", expert=expert))
    True
    >>> is_batched_mm(Gemm(id=0, m=1, n=8, k=4, groups=4, target="moe_experts_gate_up",
    ...                    expert=expert.model_copy(update={"impl": ExpertsImpl.BMM})))
    False
    """
    return op.groups <= 1 and op.expert is not None and op.expert.impl is ExpertsImpl.BATCHED_MM


def _expert_product(op: Gemm) -> int | None:
    """The experts of the loop a single expert product belongs to (``None``: not an expert product).

    One product per expert that received rows is how the eager experts loop and torch's fallback of
    ``_grouped_mm`` (dtypes without a grouped kernel) run the experts: such a product is as efficient
    as the profile's expert-loop points (``gemm:grouped:loop``, measured as that loop runs: small
    per-expert GEMMs back to back, each expert's weights cold), not as a dense GEMM of its shape.
    So is a ``batched_mm`` expert GEMM of one token-expert pair (a top-1 decode token) in a profile without
    :data:`BATCHED_MM` points: a ``bmm`` of one row against one expert's cold weight copy runs as long as one
    product of the loop (H100, Qwen3-30B-A3B: 5.6 and 4.2 us, the loop points' 5.6 and 4.1 a product), where
    the grouped bmm points, all of 8 or more products, price it at a third of that
    (``tests/data/h100/batched_mm.json``). Of more pairs it is then a grouped bmm (:func:`_batched_mm_before`).
    """
    if op.groups > 1 or op.batch > 1 or op.expert is None:
        return None
    return op.expert.experts


TILE_ROWS = 128
"""Rows per tile of the grouped GEMM kernel torch runs for ``_grouped_mm`` on sm90 (CUTLASS, 128 x 256 x 64
tiles, as its kernel name says): an expert with ``r`` rows costs ``ceil(r / 128)`` row tiles."""


def expected_row_tiles(rows: float, experts: int, top_k: int) -> float:
    """Expected :data:`TILE_ROWS` row tiles of one expert whose rows a uniform router deals: each of the
    ``T = rows * experts / top_k`` tokens picks it with probability ``top_k / experts``, so its rows are
    Binomial(T, k/E) with mean ``rows``.

    >>> round(expected_row_tiles(512, 8, 2), 1), expected_row_tiles(512, 8, 8)
    (4.5, 4.0)
    """
    p = min(1.0, top_k / experts)
    n = max(1, round(rows / p))
    if p >= 1.0:
        return float(math.ceil(n / TILE_ROWS))
    sd = math.sqrt(n * p * (1.0 - p))
    lo, hi = max(0, math.floor(rows - 12 * sd - 1)), min(n, math.ceil(rows + 12 * sd + 1))
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = weight = 0.0
    for x in range(lo, hi + 1):
        w = math.exp(log_n - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * log_p + (n - x) * log_q)
        total += w * math.ceil(x / TILE_ROWS)
        weight += w
    return total / weight if weight > 0 else float(math.ceil(rows / TILE_ROWS))


def row_tiles_factor(op: Gemm) -> float:
    """How much longer a ``_grouped_mm`` expert GEMM runs for a router's uneven loads than for the even
    loads the profile measured (``validators.inputs.routing_counts``): the expected row tiles of a
    uniform router (:func:`expected_row_tiles`) over those of ``m`` rows per expert (below 1 where some
    experts' loads fall under a tile boundary the even loads cross). 1 for a GEMM that is no expert GEMM
    (its ``expert`` field gives the experts and top-k), or below a tile (one partly filled tile either way)."""
    expert = op.expert
    if op.groups <= 1 or expert is None or op.m < TILE_ROWS:
        return 1.0
    even = math.ceil(op.m / TILE_ROWS)
    return expected_row_tiles(op.m, expert.experts, expert.top_k) / even


def router_tiles(op: OpBase, hw: HardwareSpec) -> tuple[float, str]:
    """How much longer a ``_grouped_mm`` expert GEMM runs for a router's loads than for the even loads
    that replay and the profile's sweep measure it with, and a note saying so (``(1.0, "")`` for any
    other op): its padded row tiles (:func:`row_tiles_factor`) are MMA work, so the roofline's compute
    term grows by their ratio and its memory term stays."""
    if not isinstance(op, Gemm) or op.groups <= 1 or grouped_kernel(op) != "grouped_mm":
        return 1.0, ""
    rows = row_tiles_factor(op)
    compute_s, memory_s = roofline_terms(op, hw)
    roof = max(compute_s, memory_s)
    if roof <= 0 or rows == 1.0:
        return 1.0, ""
    tiles = max(compute_s * rows, memory_s) / roof
    note = (
        f"row tiles x{rows:.3f} (a uniform router's loads of {op.m} rows per expert on average against "
        f"the even loads measured; {TILE_ROWS}-row tiles): x{tiles:.3f} on the roofline"
    )
    return tiles, note


def _issued_as(op: OpBase, f: Features | None) -> Features | None:
    """The features whose host time ``op`` pays: an expert product priced from the expert-loop points is
    one ``mm`` call (a dense GEMM's issue time), not the whole expert loop the regime's points issued."""
    if f is not None and f.regime == EXPERT_LOOP and isinstance(op, Gemm) and _expert_product(op) is not None:
        return dataclasses.replace(f, regime="gemm")
    return f


def _batched_mm_before(op: Gemm) -> Features:
    """A ``batched_mm`` expert GEMM's features before :data:`BATCHED_MM` was swept: one pair an expert
    product of the loop (:func:`_expert_product`), more pairs the grouped bmm's kernel with a product per
    pair, not that of RoPE's k = 1 products (``gemm:batched``, which priced them 3-7x too long on an H100)."""
    nk = (_lg(op.n), _lg(op.k))
    if _expert_product(op) is not None:
        return _loop_features(op)
    return Features(GROUPED_BMM, "m", _lg(op.m), (*nk, _lg(op.batch)), ("n", "k", "experts"))


def _loop_features(op: Gemm) -> Features:
    """An expert-loop product's features: along its bytes, at its rows per expert (``m``). Its expert's
    weights, read cold, decide its time: the products of every family measured fall on one efficiency
    curve over their bytes (H100, 128-256 rows: 0.25 of the roofline at 3.9 MB, 0.59 at 37 MB, 0.77 at 235 MB),
    where the experts' count and the ``(n, k)`` that make the bytes do not. A loop point (``groups`` =
    experts, each expert the same rows) stands for one of its products."""
    products = max(op.groups, 1)
    return Features(EXPERT_LOOP, "bytes", _lg(roofline_bytes(op) / products), (_lg(op.m),), ("m",), products)


def profile_features(op: OpBase) -> Features | None:
    """The :class:`Features` of ``op``, or ``None`` for kinds a profile does not hold (views,
    collectives, unrecognised ops)."""
    nbytes = _lg(roofline_bytes(op))
    if isinstance(op, Gemm):
        nk = (_lg(op.n), _lg(op.k))
        if is_batched_mm(op):
            # One bmm of ``batch`` token-expert pairs (``m`` rows each: one, as transformers runs it), one
            # pair included: the same kernel from a top-1 decode token to a prefill, so one series.
            pairs = _lg(op.batch * max(op.m, 1))
            return Features(BATCHED_MM, "pairs", pairs, nk, ("n", "k"), fallback=_batched_mm_before(op))
        if _expert_product(op) is not None or (op.groups > 1 and grouped_kernel(op) == "loop"):
            return _loop_features(op)
        if op.groups > 1:
            return Features(
                f"gemm:grouped:{grouped_kernel(op)}", "m", _lg(op.m), (*nk, _lg(op.groups)), ("n", "k", "experts")
            )
        if op.expert is not None and grouped_kernel(op) == "bmm":
            # A batched expert GEMM of one product per expert or pair that names no ``batched_mm``: the
            # kernel of the grouped bmm points ([experts, m, k] @ [experts, k, n]).
            return _batched_mm_before(op)
        suffix = UNALIGNED if unaligned_gemm(op) else ""
        if op.batch > 1:
            suffix += ACCUMULATE if op.accumulates else ""
            return Features(f"gemm:batched{suffix}", "m", _lg(op.m), (_lg(op.batch), *nk), ("batch", "n", "k"))
        return Features(f"gemm{suffix}", "m", _lg(op.m), nk, ("n", "k"))
    if isinstance(op, Attention):
        heads = (_lg(op.batch), _lg(op.heads), _lg(op.head_dim), _lg(op.heads // op.kv_heads))
        names: tuple[str, ...] = ("batch", "heads", "head_dim", "gqa")
        kv = min(op.kv_len, op.window) if op.window else op.kv_len
        hides = op.window is not None and op.window < op.kv_len
        if op.q_len == 1:
            # A decode kernel splits its work over (sequence, KV head) pairs: how many there are, not
            # the batch and head counts apart, decides how much of the GPU it fills. Once the keys fill a
            # window the model passes a mask, and SDPA runs a kernel that takes one, over every key.
            units = (_lg(op.batch * op.kv_heads), _lg(op.head_dim), _lg(op.heads // op.kv_heads))
            regime, size = ("attention:decode" + MASKED, op.kv_len) if op.window_full else ("attention:decode", kv)
            return Features(regime, "kv_len", _lg(size), units, ("batch*kv_heads", "head_dim", "gqa"))
        if not op.causal:
            regime = "attention:full"
        elif hides or op.q_len != op.kv_len:
            regime = "attention:masked"
        else:
            regime = "attention:prefill"
        return Features(regime, "q_len", _lg(op.q_len), (_lg(kv / op.q_len), *heads), ("kv/q", *names))
    simple: dict[type[OpBase], tuple[str, tuple[float, ...], tuple[str, ...]]] = {}
    if isinstance(op, Norm):
        simple[Norm] = (f"norm:{op.variant.value}", (_lg(op.hidden),), ("hidden",))
    elif isinstance(op, Rope):
        simple[Rope] = ("rope" + (FLOAT_TABLES if float_tables(op) else ""), (_lg(op.head_dim),), ("head_dim",))
    elif isinstance(op, Activation):
        gated = op.gated or op.fn in ("swiglu", "geglu")
        simple[Activation] = (f"activation:{op.fn}{':gated' if gated and not op.fn.endswith('glu') else ''}", (), ())
    elif isinstance(op, Elementwise):
        simple[Elementwise] = (f"elementwise:{op.fn}{SCALAR if op.scalar else ''}", (), ())
    elif isinstance(op, Softmax):
        simple[Softmax] = ("softmax", (_lg(op.cols),), ("cols",))
    elif isinstance(op, Reduction):
        simple[Reduction] = (f"reduction:{op.fn}", (_lg(op.reduced),), ("reduced",))
    elif isinstance(op, TopK):
        simple[TopK] = (f"topk:{op.fn}", (_lg(op.cols),), ("cols",))
    elif isinstance(op, Memory):
        simple[Memory] = (f"memory:{op.fn}", (), ())
    elif isinstance(op, Embedding):
        simple[Embedding] = ("embedding", (_lg(op.hidden),), ("hidden",))
    elif isinstance(op, MoeRouting):
        regime = f"moe_routing:{op.fn}"
        if op.fn == "combine" and op.weights_dtype is not op.dtype:
            # Routing weights in another dtype (Mixtral's float32) make the combine weigh, gather and
            # sum in that dtype before casting back: another kernel mix than the op's dtype alone.
            regime += f"{WEIGHTS}{op.weights_dtype.value}"
        simple[MoeRouting] = (regime, (_lg(op.experts), _lg(op.top_k)), ("experts", "top_k"))
    if not simple:
        return None
    regime, shape, names = next(iter(simple.values()))
    if isinstance(op, LAYOUT_BOUND) and broadcast_input(op):
        regime += BROADCAST
        regime += STRIDED if strided_under_broadcast(op) else ""
    elif isinstance(op, LAYOUT_BOUND) and strided_input(op):
        regime += STRIDED
    else:
        regime += HALF_TO_FLOAT if half_input_softmax(op) else ""
        regime += MASKED if isinstance(op, Softmax) and op.masked else ""
        regime += UNALIGNED if unaligned_rows(op) else ""
    return Features(regime, "bytes", nbytes, shape, names)


STRIDED = ":strided"
"""Regime suffix of an op that reads a non-contiguous input (see :func:`strided_input`)."""
WEIGHTS = ":weights_"
"""Regime suffix of an MoE combine whose routing weights are in another dtype (``:weights_fp32``)."""
BROADCAST = ":broadcast"
"""Regime suffix of an op that reads an input broadcast over it (see :func:`broadcast_input`)."""
UNALIGNED = ":unaligned"
"""Regime suffix of a dense or batched GEMM, or of a row-wise kernel, whose rows are not 16-byte aligned
(see :func:`unaligned_gemm` and :func:`unaligned_rows`)."""
MASKED = ":masked"
"""Regime suffix of a softmax over a causal prefill's scores (:attr:`opgraph.ir.Softmax.masked`), and of a
one-token decode whose keys fill its sliding window (SDPA given a mask: :attr:`opgraph.ir.Attention.window_full`)."""
ACCUMULATE = ":accumulate"
"""Regime suffix of a batched GEMM that adds its product onto an operand it reads
(:attr:`opgraph.ir.Gemm.accumulates`: BLOOM's alibi scores, 540 us a layer at b4 s2048 against 412 priced
from plain bmm points)."""
FLOAT_TABLES = ":float_tables"
"""Regime suffix of a rotary embedding whose cos/sin tables are wider than its queries (see :func:`float_tables`)."""
HALF_TO_FLOAT = ":half_to_float"
"""Regime suffix of a softmax taken in float32 of half input (see :func:`half_input_softmax`)."""
SCALAR = ":scalar"
"""Regime suffix of an elementwise op whose second operand is a scalar (:attr:`opgraph.ir.Elementwise.scalar`):
one tensor read, another kernel."""
VARIANTS = (STRIDED, WEIGHTS, UNALIGNED, BROADCAST, SCALAR, HALF_TO_FLOAT, ACCUMULATE, MASKED, FLOAT_TABLES)
"""Regime suffixes of a variant of a regime: a profile without the variant's points predicts it from the
nearest regime it has of :func:`variant_chain` (the plain regime last), and says so."""


def variant_chain(regime: str) -> tuple[str, ...]:
    """``regime`` and the regimes it falls back to where a profile lacks it: the same with fewer of its
    variant suffixes, the most kept first (among as many, the earlier suffixes kept).

    >>> variant_chain("softmax:masked:unaligned")
    ('softmax:masked:unaligned', 'softmax:masked', 'softmax:unaligned', 'softmax')
    """
    cuts = sorted(i for i in (regime.find(suffix) for suffix in VARIANTS) if i > 0)
    if not cuts:
        return (regime,)
    parts = [regime[a:b] for a, b in zip(cuts, [*cuts[1:], len(regime)], strict=True)]
    kept = (c for k in range(len(parts), -1, -1) for c in itertools.combinations(parts, k))
    return tuple(dict.fromkeys(regime[: cuts[0]] + "".join(c) for c in kept))


def variant_base(regime: str) -> str:
    """``regime`` without its variant suffixes (:data:`VARIANTS`), or itself.

    >>> variant_base("elementwise:mul:scalar:strided")
    'elementwise:mul'
    """
    return variant_chain(regime)[-1]


LAYOUT_BOUND: tuple[type[OpBase], ...] = (Activation, Elementwise, Memory)
"""Kinds whose kernel changes with the input layout: a copy out of a transposed view (a prefill's
KV-cache write, 3.5-6x the time of a contiguous one), a gated activation over the two halves of one
chunked projection (an MoE block's ``gate_up``, about 1.8x)."""


ALIGN_BYTES = 16
"""The row alignment cuBLAS's vectorised GEMM kernels need: rows whose length or stride is not a multiple
of it run other kernels (an eager decode's ``q @ K^T`` over ``kv_len + 1`` keys: a ``gemvx`` kernel
about twice as long as the aligned one)."""


def _misaligned(elements: int, itemsize: float) -> bool:
    """Whether a row (or row stride) of ``elements`` of more than one is not :data:`ALIGN_BYTES`-aligned."""
    return elements > 1 and bool((elements * itemsize) % ALIGN_BYTES)


def unaligned_gemm(op: Gemm) -> bool:
    """Whether a row of an operand or of the output of ``op`` is not :data:`ALIGN_BYTES`-aligned: ``k``
    or ``n`` elements (of more than one: a vector has no rows to align) that are not a multiple of it, or a
    recorded operand whose row stride is not (a view that slices a row, such as gpt-oss's values matmul
    on its weights without the sink column)."""
    if _misaligned(op.k, op.dtype.itemsize) or _misaligned(op.n, op.dtype.itemsize):
        return True
    return any(
        dim > 1 and _misaligned(stride, t.dtype.itemsize)
        for t in op.inputs
        if t.strides is not None and len(t.shape) >= 2
        for dim, stride in zip(t.shape, t.strides, strict=True)
    )


def unaligned_rows(op: OpBase) -> bool:
    """Whether a row-wise kernel's rows are not :data:`ALIGN_BYTES`-aligned: a softmax's columns, a row
    reduction's reduced elements, the last dimension a copy writes (a ``cat`` adding gpt-oss's sinks column
    to 2048 keys: 1.6 ms where aligned rows took 0.36). An elementwise kernel runs over the flat tensor,
    whatever its rows."""
    row: int | None = None
    if isinstance(op, Softmax):
        row = op.cols
    elif isinstance(op, Reduction):
        row = op.reduced
    elif isinstance(op, Memory) and op.outputs and len(op.outputs[0].shape) >= 2:
        row = op.outputs[0].shape[-1]
    return row is not None and _misaligned(row, op.dtype.itemsize)


def float_tables(op: OpBase) -> bool:
    """Whether ``op`` is a rotary embedding whose recorded cos/sin tables (``[b, 1, s, d]``) are wider than its
    dtype: OLMo 2's float32 tables under bfloat16 queries, so ``q * cos + rotate_half(q) * sin`` runs in float32
    before the cast back (OLMo 2-7B's prefill at 4096 tokens on an H100: 1.6-1.9x what bfloat16 tables' points
    give)."""
    return isinstance(op, Rope) and any(
        len(t.shape) == 4 and t.shape[1] == 1 and t.dtype.is_float and t.dtype.itemsize > op.dtype.itemsize
        for t in op.inputs
    )


def half_input_softmax(op: OpBase) -> bool:
    """Whether ``op`` is a softmax taken in a wider dtype than its input (``softmax(x, dtype=torch.float32)``
    of half ``x``: ATen's ``half_to_float`` kernel, which past 1024 columns is a block per row, where float32
    input of 2048 columns runs the warp kernel: 1.7 ms a layer against 0.7 for Llama-1B fp16 b2 s2048)."""
    return isinstance(op, Softmax) and any(t.dtype.itemsize < op.dtype.itemsize for t in op.inputs if t.dtype.is_float)


def broadcast_input(op: OpBase) -> bool:
    """Whether ``op`` reads a non-empty input through a stride of 0 over a dimension of more than one (an
    expanded view: ``repeat_kv``'s keys, a mask over the heads, gpt-oss's sinks over the queries), a kernel
    unlike the one over a transposed view."""

    def expanded(t: TensorSpec) -> bool:
        return t.strides is not None and any(d > 1 and not st for d, st in zip(t.shape, t.strides, strict=True))

    return any(t.numel > 0 and expanded(t) for t in op.inputs)


def strided_under_broadcast(op: OpBase) -> bool:
    """Whether a broadcast input of ``op`` is also laid out otherwise than row-major once its broadcast
    dimensions are dropped: a transposed view expanded over heads (SDPA's math path copying the transposed
    keys of one head to every query head, 3x the time of the same copy of the values), where ``repeat_kv``'s
    expanded keys or a mask over the heads are row-major under their broadcast."""

    def transposed(t: TensorSpec) -> bool:
        if t.strides is None or all(t.strides):
            return False
        kept = [(d, s) for d, s in zip(t.shape, t.strides, strict=True) if s or d <= 1]
        return not is_contiguous(tuple(d for d, _ in kept), tuple(s for _, s in kept))

    return any(t.numel > 0 and transposed(t) for t in op.inputs)


def strided_input(op: OpBase) -> bool:
    """Whether ``op`` reads a non-empty input whose recorded strides are not the contiguous ones
    (size-1 dims aside: a transposed view of one token is still dense)."""
    return any(t.numel > 0 and not is_contiguous(t.shape, t.strides) for t in op.inputs)


def roofline_terms(op: OpBase, hw: HardwareSpec) -> tuple[float, float]:
    """(compute, memory) seconds of ``op`` at the datasheet peaks of ``hw``: tensor units for matmuls
    (fp32 on TF32 only where the device has no fp32 tensor rate, as PyTorch's default keeps it off),
    vector units for the rest."""
    kind = getattr(op, "kind", OpKind.OTHER)
    if kind in OpCategory.MATMUL:
        if op.dtype is DType.fp32:
            peak = float(hw.tensor.fp32 or hw.peak_flops(DType.fp32, tensor=False))
        else:
            peak = hw.peak_flops(op.dtype, tensor=True)
    else:
        peak = hw.peak_flops(op.dtype, tensor=False)
    return op.flops / peak, roofline_bytes(op) / hw.memory_bandwidth


FIELD_DEFINED: tuple[type[OpBase], ...] = (Activation, Elementwise, MoeRouting, Norm, Rope, Softmax)
"""Kinds whose profile points are measured from their fields alone (no recorded tensors: the replay
recipe builds its own), so their roofline counts the bytes the fields imply, for a captured op too."""


def roofline_bytes(op: OpBase) -> float:
    """The bytes the roofline charges ``op``: those its fields imply for :data:`FIELD_DEFINED` kinds, so
    an op and the profile points it is predicted from share one definition (a captured op's tensors can
    say otherwise: an MoE block's gated activation reads both halves of one chunked tensor, recorded
    once; its routing steps move fp32 and index tensors the kind's fields do not name); else the
    recorded bytes."""
    if isinstance(op, FIELD_DEFINED):
        read, written = op.field_bytes()
        if read + written > 0:
            return float(read + written)
    return float(op.total_bytes)


def roofline_seconds(op: OpBase, hw: HardwareSpec) -> float:
    """``max(compute, memory)`` of :func:`roofline_terms`: the time an op takes at 100% efficiency."""
    return max(roofline_terms(op, hw))


@dataclass
class _Group:
    """The measured sizes of one shape of one regime and dtype."""

    shape: tuple[float, ...]
    label: str
    sizes: list[float] = field(default_factory=list)
    log_eff: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    log_roof: list[float] = field(default_factory=list)
    """ln of the roofline seconds of the points (what the efficiencies are relative to)."""
    time_below: bool = False
    """The size axis is the op's bytes (the roofline time is proportional to it): see :meth:`at`."""
    dtype: DType | None = None
    """The dtype measured, when the group was borrowed from a twin dtype (see :func:`twin_dtypes`)."""

    def at(self, x: float) -> tuple[float, str, float]:
        """(log efficiency, points used, log2 distance outside the measured sizes) at size ``x``.

        Under the smallest measured size of a ``bytes`` axis the *time* of the smallest point holds
        (the efficiency falls with the work): a kernel that small is latency-bound, it does not get
        faster with less data. Elsewhere past the edge the edge's efficiency holds."""
        xs = self.sizes
        if x <= xs[0]:
            below = (x - xs[0]) * math.log(2.0) if self.time_below else 0.0
            return self.log_eff[0] + below, self.names[0], xs[0] - x
        if x >= xs[-1]:
            return self.log_eff[-1], self.names[-1], x - xs[-1]
        i = bisect.bisect_right(xs, x)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        le = self.log_eff[i - 1] + t * (self.log_eff[i] - self.log_eff[i - 1])
        used = self.names[i - 1] if t < 1e-9 else f"{self.names[i - 1]}..{self.names[i]}"
        return le, used, 0.0

    def roof_and_elasticity(self, x: float) -> tuple[float, float]:
        """(ln roofline seconds, elasticity) at size ``x``: the roofline of this shape at that size
        (log-linear between the measured sizes, along the nearest segment past them) and how the
        measured time follows it there, ``d ln time / d ln roofline`` in [0, 1] (0: latency-bound,
        the time stays; 1: the efficiency stays). One measured size: 1."""
        xs, lr = self.sizes, self.log_roof
        if len(xs) < 2:
            return lr[0], 1.0
        i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        roof = lr[i - 1] + t * (lr[i] - lr[i - 1])
        d_roof = lr[i] - lr[i - 1]
        d_time = d_roof - (self.log_eff[i] - self.log_eff[i - 1])
        if d_roof <= 0:
            return roof, 1.0
        return roof, min(max(d_time / d_roof, 0.0), 1.0)


@dataclass
class _Regime:
    groups: list[_Group]
    lo: float
    hi: float
    shape_lo: tuple[float, ...] = ()
    shape_hi: tuple[float, ...] = ()

    def shape_outside(self, shape: tuple[float, ...]) -> float:
        """log2 distance of ``shape`` outside the measured range of its worst feature (0 inside)."""
        if len(shape) != len(self.shape_lo):
            return 0.0
        return max(
            (max(lo - v, v - hi, 0.0) for v, lo, hi in zip(shape, self.shape_lo, self.shape_hi, strict=True)),
            default=0.0,
        )


def _regime(groups: list[_Group]) -> _Regime:
    dims = range(len(groups[0].shape))
    return _Regime(
        groups,
        min(g.sizes[0] for g in groups),
        max(g.sizes[-1] for g in groups),
        tuple(min(g.shape[d] for g in groups) for d in dims),
        tuple(max(g.shape[d] for g in groups) for d in dims),
    )


def twin_dtypes(dtype: DType, hw: HardwareSpec) -> tuple[DType, ...]:
    """The dtypes whose profile points stand for ``dtype``'s on ``hw``: the same element size and the
    same tensor and vector peaks (fp16 and bf16 on current GPUs)."""
    same = []
    for other in _DTYPE_FALLBACK.get(dtype, ()):
        if other.itemsize != dtype.itemsize:
            continue
        if all(hw.peak_flops(other, tensor=t) == hw.peak_flops(dtype, tensor=t) for t in (True, False)):
            same.append(other)
    return tuple(same)


@dataclass(frozen=True)
class WritebackCurve:
    """What one measured op paid for dirty L2 lines left before it (its ``writeback`` points), against
    the dirty bytes: the time over its clean-L2 point's, never below 0."""

    op: str
    """The measured op's definition."""
    dirty: tuple[float, ...]
    """Dirty bytes, ascending, from 0."""
    penalty_s: tuple[float, ...]
    """Extra seconds at each."""

    def at(self, dirty_bytes: float) -> float:
        """The penalty at ``dirty_bytes``: linear between the measured amounts, the last one's past them."""
        i = bisect.bisect_right(self.dirty, dirty_bytes)
        if i >= len(self.dirty):
            return self.penalty_s[-1]
        if i == 0:
            return 0.0
        x0, x1 = self.dirty[i - 1], self.dirty[i]
        y0, y1 = self.penalty_s[i - 1], self.penalty_s[i]
        return y0 + (y1 - y0) * (dirty_bytes - x0) / (x1 - x0)


def writes_through(op: OpBase) -> bool:
    """Whether ``op`` leaves no dirty lines in L2: a GEMM, whose output cuBLAS writes through (an ``add``
    reading 32 MiB an ``mm`` just wrote takes 1.8 us more than reading it clean on an H100, 6.5 us after
    ``mul_`` or ``copy_`` wrote it, 4.6 after ``cat``, 5.0 after SDPA: ``benchmarks/gpu/own_input_probe.py``)."""
    return op.kind is OpKind.GEMM


def evicted_dirty_bytes(op: OpBase, before: OpBase, l2_bytes: float) -> float:
    """The bytes of ``before``'s output that ``op`` makes the L2 write back: the lines ``before`` wrote are
    the newest in the L2 (up to all of it), so they leave it, least recently used last, only for what
    ``op`` brings in past the rest of the L2; what ``op`` reads of ``before``'s output hits them.
    No L2 size (``l2_bytes`` 0): every dirty byte ``op`` could meet, up to the bytes it moves.

    A GEMM leaves none (:func:`writes_through`).

    Examples
    --------
    >>> from opgraph.ir import DType, Elementwise, TensorSpec
    >>> out = TensorSpec(shape=(8 << 20,), dtype=DType.bf16, id=1)  # 16 MiB
    >>> writer = Elementwise(id=0, fn="add", numel=8 << 20, outputs=(out,))
    >>> small = Elementwise(id=1, fn="mul", numel=4 << 20)  # moves 24 MiB: the dirty lines stay
    >>> big = Elementwise(id=2, fn="mul", numel=16 << 20)  # moves 96 MiB: they all leave
    >>> other, res = (TensorSpec(shape=(8 << 20,), dtype=DType.bf16, id=i) for i in (2, 3))
    >>> reader = Elementwise(id=3, fn="mul", numel=8 << 20, inputs=(out, other), outputs=(res,))  # 16 of 48 MiB hit
    >>> stranger = Elementwise(id=4, fn="mul", numel=8 << 20, inputs=(other, other), outputs=(res,))  # none hit
    >>> [evicted_dirty_bytes(o, writer, 50 << 20) / 2**20 for o in (small, big, reader, stranger)]
    [0.0, 16.0, 0.0, 14.0]
    """
    written = 0.0 if writes_through(before) else float(before.bytes_written)
    moved = float(op.bytes_read + op.bytes_written)
    if written <= 0 or moved <= 0:
        return 0.0
    if l2_bytes <= 0:
        return min(written, moved)
    made = {t.id for t in before.outputs if t.id is not None}
    hits = min(sum(t.nbytes for t in op.inputs if t.id is not None and t.id in made), written)
    dirty = min(written, l2_bytes)
    return max(0.0, min(dirty, moved - hits + dirty - l2_bytes))


WRITEBACK_MAX_BYTES = 64 << 20
"""The most dirty bytes the sweep's ``writeback`` points ask for (the last of ``validators.profile.WRITEBACK_MIB``)."""
WRITEBACK_TAG = "writeback"
"""The tag of the sweep's points measured after a write of their ``dirty_bytes`` (:class:`WritebackCurve`)."""


def writeback_curves(profile: DeviceProfile, hw: HardwareSpec) -> dict[tuple[str, bool], list[WritebackCurve]]:
    """The profile's write-back curves by (op kind, memory-bound on ``hw``'s roofline): each measured op's
    ``writeback`` points against its own clean one (an op without one at 0 dirty bytes is left out)."""
    by_op: dict[str, list[ProfilePoint]] = {}
    for p in profile.points:
        if p.tag == WRITEBACK_TAG:
            by_op.setdefault(p.key.rsplit(f"-{WRITEBACK_TAG}", 1)[0], []).append(p)
    out: dict[tuple[str, bool], list[WritebackCurve]] = {}
    for pts in by_op.values():
        pts.sort(key=lambda p: p.dirty_bytes)
        f = profile_features(pts[0].op)
        if f is None or pts[0].dirty_bytes != 0 or len(pts) < 2:
            continue
        clean = pts[0].seconds
        compute_s, memory_s = roofline_terms(pts[0].op, hw)
        curve = WritebackCurve(
            pts[0].op.definition,
            tuple(float(p.dirty_bytes) for p in pts),
            tuple(max(p.seconds - clean, 0.0) for p in pts),
        )
        out.setdefault((f.family, memory_s >= compute_s), []).append(curve)
    return out


class _Index:
    """The profile's points as efficiencies on one device, by (regime, dtype)."""

    def __init__(self, profile: DeviceProfile, hw: HardwareSpec) -> None:
        raw: dict[tuple[str, DType], dict[tuple[float, ...], dict[float, list[tuple[float, str, float]]]]] = {}
        labels: dict[tuple[float, ...], str] = {}
        axes: dict[str, str] = {}
        self.host: dict[str, list[float]] = {}
        """Measured host times by regime (``gemm`` is the dense GEMMs' regime)."""
        self.host_family: dict[str, list[float]] = {}
        """Measured host times by kind (``gemm``: every GEMM regime, expert loops included)."""
        self.skipped = 0
        self.writeback = writeback_curves(profile, hw)
        """Write-back curves by (op kind, memory-bound)."""
        dirty = [p.dirty_bytes for p in profile.points if p.tag == WRITEBACK_TAG]
        self.writeback_l2 = float(max(dirty)) if dirty and max(dirty) < WRITEBACK_MAX_BYTES else 0.0
        """The device's L2 as the sweep found it (its timer leaves at most the L2 dirty, so the largest
        dirty bytes of the ``writeback`` points, where below the most the sweep asks); 0 when unknown."""
        for p in profile.points:
            if p.tag:
                continue
            f = profile_features(p.op)
            roof = roofline_seconds(p.op, hw)
            if f is None or roof <= 0 or p.seconds <= 0:
                self.skipped += 1
                continue
            if (host := profile.issue_s(p)) is not None:
                self.host.setdefault(f.regime, []).append(host)
                self.host_family.setdefault(f.family, []).append(host)
            labels.setdefault(f.shape, f.label())
            axes[f.regime] = f.axis
            name = f"{f.axis}={2**f.size:.4g}" + (f"@{f.label()}" if f.shape else "")
            sizes = raw.setdefault((f.regime, p.op.dtype), {}).setdefault(f.shape, {})
            sizes.setdefault(f.size, []).append((math.log(roof / p.seconds), name, math.log(roof / f.products)))
        self.regimes: dict[tuple[str, DType], _Regime] = {}
        self.pooled: dict[tuple[str, DType], _Regime] = {}
        """Regimes with the shapes their twin dtypes measured added (see :meth:`find`)."""
        for key, by_shape in raw.items():
            groups = []
            for shape, sizes in by_shape.items():
                g = _Group(shape, labels[shape], time_below=axes[key[0]] == "bytes")
                for x in sorted(sizes):
                    vals = sizes[x]
                    g.sizes.append(x)
                    g.log_eff.append(statistics.fmean(v for v, _, _ in vals))
                    g.log_roof.append(statistics.fmean(r for _, _, r in vals))
                    g.names.append(vals[0][1])
                groups.append(g)
            self.regimes[key] = _regime(groups)
        # A dtype's points lend their shapes to its twins (same element size, same peaks: fp16 and
        # bf16 run the same kernels at the same rates), where the twin measured no such shape.
        own = dict(self.regimes)
        for (name, dt), regime in own.items():
            shapes = {g.shape for g in regime.groups}
            borrowed = []
            for twin in twin_dtypes(dt, hw):
                for g in own[(name, twin)].groups if (name, twin) in own else ():
                    if g.shape not in shapes:
                        shapes.add(g.shape)
                        borrowed.append(dataclasses.replace(g, dtype=twin))
            if borrowed:
                self.pooled[(name, dt)] = _regime([*regime.groups, *borrowed])

    def find(self, f: Features, dtype: DType, pooled: bool = False) -> tuple[_Regime, str, DType, Features] | None:
        """The regime's points for ``dtype`` (or the nearest dtype; for a regime the profile lacks, those of
        ``f.fallback``, else a sibling regime of the kind) and the features the op has among them;
        ``pooled``: with the shapes only a twin dtype measured."""
        hit = self._find(f, dtype, pooled, siblings=f.fallback is None)
        if hit is not None:
            return (*hit, f)
        if f.fallback is not None:
            return self.find(f.fallback, dtype, pooled)
        return None

    def _find(self, f: Features, dtype: DType, pooled: bool, *, siblings: bool) -> tuple[_Regime, str, DType] | None:
        dtypes = (dtype, *_DTYPE_FALLBACK.get(dtype, (DType.bf16, DType.fp16, DType.fp32)))
        # A variant the profile did not measure (a layout, a weights dtype): the plain regime's points, said so.
        # The op's dtype or one of its size (fp16 and bf16 run the same kernels) before another size's kernels;
        # within each, the variant nearest the op's own.
        near = tuple(d for d in dtypes if d.itemsize == dtype.itemsize)
        for group in (near, tuple(d for d in dtypes if d not in near)):
            for name in variant_chain(f.regime):
                for dt in group:
                    hit = (self.pooled.get((name, dt)) if pooled else None) or self.regimes.get((name, dt))
                    if hit is not None:
                        return hit, name, dt
        # A grouped GEMM implementation the profile did not measure: the nearest implementation first
        # (a grouped kernel reads like the batched one, not like a loop of per-expert GEMMs); an ungated
        # activation: an ungated one.
        for name in _nearest_regimes(variant_base(f.regime)):
            for dt in dtypes:
                hit = self.regimes.get((name, dt))
                if hit is not None:
                    return hit, name, dt
        for dt in dtypes if siblings else ():
            kin = [
                (len(r.groups), name)
                for (name, d), r in self.regimes.items()
                if d is dt and name.split(":", 1)[0] == f.family and len(r.groups[0].shape) == len(f.shape)
            ]
            if kin:
                name = max(kin)[1]
                return self.regimes[(name, dt)], name, dt
        return None


class ProfileModel:
    """Predicts ops from a measured :class:`~hardware.profile.DeviceProfile` (see the module docstring).

    Parameters
    ----------
    profile:
        A profile or the path of one (``path=`` is the same, for option strings). Without one, the
        profile the device ships with (``profile = ...`` in its catalog TOML) is used.
    check_hardware:
        Refuse to predict for a device other than the one measured (catalog names compared).
    fallback:
        A cost model (or spec) for kinds the profile lacks and collectives; the datasheet roofline.
    writeback:
        Charge each op for the dirty L2 lines the op before it left (:meth:`after_write`), from the
        profile's ``writeback`` points.
    """

    name = "profile"

    def __init__(
        self,
        profile: DeviceProfile | str | Path | None = None,
        *,
        path: str | Path | None = None,
        check_hardware: bool | str = True,
        fallback: CostModel | str | None = None,
        writeback: bool | str = True,
    ) -> None:
        source = profile if profile is not None else path
        self.path: str | None = None if source is None or isinstance(source, DeviceProfile) else str(source)
        self.profile: DeviceProfile | None = source if isinstance(source, DeviceProfile) else None
        if self.path is not None:
            self.profile = load_profile(self.path)
        self.check_hardware = flag(check_hardware)
        self.writeback = flag(writeback)
        from hardware.models.registry import resolve_cost_model

        if fallback is None or isinstance(fallback, str):
            fallback = resolve_cost_model(fallback or "roofline")
        self.fallback: CostModel = fallback
        self._shipped: dict[str, tuple[DeviceProfile, str]] = {}
        self._index: dict[tuple[int, str], _Index] = {}
        self._warned = False
        self._warned_writeback = False

    # -- which profile, for which device --------------------------------------------------------------

    def _profile_for(self, hw: HardwareSpec) -> tuple[DeviceProfile, str]:
        if self.profile is not None:
            return self.profile, self.path or "profile"
        hit = self._shipped.get(hw.name)
        if hit is None:
            path = hardware_profile(hw)
            if path is None:
                raise CostModelError(
                    f"{hw.name} ships no measured profile",
                    where="--cost-model profile",
                    hint="measure one with `opgraph profile --device cuda -o FILE` and pass -c FILE, "
                    "or use -c roofline (datasheet)",
                )
            hit = self._shipped[hw.name] = (load_profile(path), str(path))
        return hit

    def issue_basis(self, hw: HardwareSpec) -> tuple[float, str] | None:
        """The host's issue time per aten call in the profile that prices ops on ``hw`` (the footing of
        every ``Cost.host_s`` it gives) and the profile's file name; ``None`` when it has none."""
        profile, where = self._profile_for(hw)
        return (profile.aten_issue_us, Path(where).name) if profile.aten_issue_us else None

    def _check(self, profile: DeviceProfile, where: str, hw: HardwareSpec) -> None:
        measured = profile.device.hardware
        if not self.check_hardware or not measured:
            return
        from hardware.loader import normalize_name

        if normalize_name(measured) != normalize_name(hw.name):
            raise CostModelError(
                f"the profile was measured on {measured!r} ({profile.device.name or 'unknown device'}), "
                f"not {hw.name!r}",
                where=where,
                hint=f"simulate with --hardware {measured}, or pass --cost-option check_hardware=false",
            )

    def index(self, hw: HardwareSpec) -> _Index:
        """The profile's points as efficiencies on ``hw`` (built once per profile and device)."""
        profile, _ = self._profile_for(hw)
        key = (id(profile), hw.name)
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = _Index(profile, hw)
        return idx

    # -- costing ---------------------------------------------------------------------------------------

    def _fallback(self, op: OpBase, hw: HardwareSpec, why: str) -> Cost:
        cost = self.fallback.estimate(op, hw)
        return dataclasses.replace(cost, detail=f"{why}: {cost.detail}".rstrip(": "))

    def _host_s(self, profile: DeviceProfile, idx: _Index, f: Features | None) -> float | None:
        if f is not None:
            for hosts in (idx.host.get(f.regime), idx.host_family.get(f.family)):
                if hosts:
                    return statistics.median(hosts)
        return profile.aten_issue_us * 1e-6 if profile.aten_issue_us is not None else None

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """``roofline / efficiency`` of ``op`` from the profile's nearest measured points (eager attention:
        the sum of its kernels', :func:`~hardware.base.eager_attention_cost`)."""
        eager = eager_attention_cost(self, op, hw)
        if eager is not None:
            return eager
        kind = getattr(op, "kind", OpKind.OTHER)
        if kind is OpKind.VIEW:
            return Cost(0.0, Bound.FREE, detail="view: no kernel")
        if kind is OpKind.COLLECTIVE:
            return self.fallback.estimate(op, hw)
        profile, where = self._profile_for(hw)
        self._check(profile, where, hw)
        idx = self.index(hw)
        f = profile_features(op)
        compute_s, memory_s = roofline_terms(op, hw)
        roof = max(compute_s, memory_s)
        # Memory-bound, an op's efficiency turns on its shape (latency, occupancy) more than on the
        # kernel its dtype picks: the twin dtypes' shapes count too. Compute-bound, its own dtype's.
        found = idx.find(f, op.dtype, pooled=memory_s >= compute_s) if f is not None else None
        if f is None or found is None or roof <= 0:
            why = "no roofline time" if roof <= 0 else f"not in the profile ({f.regime if f else kind})"
            cost = self._fallback(op, hw, f"profile: {why}, datasheet roofline")
            return dataclasses.replace(cost, host_s=self._host_s(profile, idx, _issued_as(op, f)))
        # A regime the profile lacks may place the op elsewhere (Features.fallback): its features there.
        asked = f.regime
        regime, regime_name, dtype, f = found
        # Along m a GEMM's shape (its weights) moves the roofline in a way m does not: no transfer. Along
        # batched_mm's pairs the roofline is the pairs' weight copies, as across its shapes: transfer (on
        # an H100 it halves the worst error of unseen models' shapes at 1-2 pairs against carrying efficiencies).
        log_eff, used, outside = self._interpolate(regime, f, None if f.axis == "m" else math.log(roof))
        eff = math.exp(log_eff)
        launch = (profile.launch_us if profile.launch_us is not None else hw.launch_latency_us) * 1e-6
        # A grouped kernel's points were measured with even loads; a router's are uneven (router_tiles).
        tiles, tiles_note = 1.0, ""
        if f.regime == GROUPED_MM and regime_name == GROUPED_MM:
            tiles, tiles_note = router_tiles(op, hw)
        eff /= tiles
        seconds = roof / eff
        bound = Bound.COMPUTE if compute_s >= memory_s else Bound.MEMORY
        shape_far = regime.shape_outside(f.shape)
        if seconds < launch and (outside > 1e-9 or shape_far > 1e-9):
            seconds, bound = launch, Bound.LAUNCH  # outside the sweep: never below an empty kernel
        notes = []
        if regime_name != asked:
            notes.append(f"no {asked} points, from {regime_name}")
        if dtype is not op.dtype:
            notes.append(f"no {op.dtype.value} points, from {dtype.value}")
        if abs(tiles - 1.0) > 5e-4:
            notes.append(tiles_note)
        beyond = max(f.size - regime.hi, regime.lo - f.size, 0.0)
        if outside > 1e-9 or shape_far > 1e-9:
            where_out = []
            if beyond > 1e-9:
                side = "past the largest" if f.size > regime.hi else "under the smallest"
                where_out.append(f"{f.axis} {2**beyond:.3g}x {side} measured")
            elif outside > 1e-9:
                where_out.append(f"{f.axis} outside the nearest shape's measured range")
            if shape_far > 1e-9:
                where_out.append(f"shape {2**shape_far:.3g}x outside the measured shapes")
            notes.append("extrapolated (" + "; ".join(where_out) + ")")
            if (beyond > FAR or shape_far > FAR) and not self._warned:
                self._warned = True
                warnings.warn(
                    f"the profile {where} extrapolates: {op.definition} ({f.axis}={2**f.size:.4g}"
                    + (f", {f.label()}" if f.shape else "")
                    + f") lies far outside the {f.regime} shapes it measured; its efficiency is that of the "
                    "nearest measured points (each such op's cost detail says 'extrapolated'); "
                    "profile this regime for measured numbers",
                    ProfileExtrapolationWarning,
                    stacklevel=2,
                )
        detail = (
            f"profile: {regime_name} {dtype.value} efficiency {eff:.3g} of the roofline "
            f"({roof * 1e6:.3g} us) from {used}" + ("; " + "; ".join(notes) if notes else "")
        )
        return Cost(
            seconds,
            bound,
            compute_s=compute_s,
            memory_s=memory_s,
            efficiency=eff,
            detail=detail,
            host_s=self._host_s(profile, idx, _issued_as(op, f)),
        )

    def after_write(self, op: OpBase, cost: Cost, before: OpBase, hw: HardwareSpec) -> Cost:
        """``cost`` plus what ``op`` pays to write back the dirty L2 lines ``before`` (the op run just
        before it) left: from the profile's ``writeback`` points of ``op``'s kind (another kind's where
        its own has none), at the dirty bytes ``op`` evicts (:func:`evicted_dirty_bytes`).

        Memory-bound ops only: a compute-bound kernel leaves the DRAM time to write the lines back
        while it computes (the sweep's compute-bound points pay 0-5 us for 50 MiB, within the 3.5%
        their time moves with the GPU's power state). A profile without such points charges nothing and
        says so once (:class:`ProfileWritebackWarning`).
        """
        if not self.writeback or op.kind in OpCategory.FREE or op.kind is OpKind.COLLECTIVE:
            return cost
        if cost.memory_s < cost.compute_s:
            return cost
        idx = self.index(hw)
        if not idx.writeback and not self._warned_writeback:
            self._warned_writeback = True
            warnings.warn(
                f"the profile {self._profile_for(hw)[1]} has no writeback points: no op is charged for the L2 lines "
                "the op before it left dirty (memory-bound ops, decodes' attention and KV-cache copies most, come out "
                "short); measure them with `opgraph profile --device cuda --resume -o FILE`",
                ProfileWritebackWarning,
                stacklevel=2,
            )
        dirty = evicted_dirty_bytes(op, before, idx.writeback_l2 or hw.l2_bytes)
        f = profile_features(op) if dirty > 0 and idx.writeback else None
        if f is None:
            return cost
        curves = idx.writeback.get((f.family, True))
        source = f.family
        if not curves:
            curves = [c for (_, memory_bound), cs in idx.writeback.items() if memory_bound for c in cs]
            source = "other kinds'"
        if not curves:
            return cost
        extra = statistics.median(c.at(dirty) for c in curves)
        if extra <= 0:
            return cost
        note = (
            f"+{extra * 1e6:.3g} us write-back of {dirty / 2**20:.3g} MiB the op before left dirty in L2 "
            f"(the {source} writeback points)"
        )
        return dataclasses.replace(cost, seconds=cost.seconds + extra, detail=f"{cost.detail}; {note}".lstrip("; "))

    @staticmethod
    def _interpolate(regime: _Regime, f: Features, log_roof: float | None = None) -> tuple[float, str, float]:
        """(log efficiency, points used, log2 distance outside the size range of the shapes used).

        With ``log_roof`` (ln of the op's roofline seconds), a neighbouring shape's efficiency is carried
        over to the op's shape as its time responds to the roofline along its size axis
        (:meth:`_Group.roof_and_elasticity`): a latency-bound shape lends its time, a bandwidth-bound
        one its efficiency."""

        def dist2(g: _Group) -> float:  # a twin dtype's shape counts as the op's own (twin_dtypes)
            return sum((a - b) ** 2 for a, b in zip(g.shape, f.shape, strict=False))

        ranked = sorted(regime.groups, key=dist2)
        if f.regime == EXPERT_LOOP:
            # A row count whose products stayed far (over 2x) from the op's bytes would hold its smallest
            # product's time or its largest's efficiency: the nearest row counts whose products reached them speak
            # for it instead (a profile whose loop points are not on one row grid: an H200's of 2026-11-26 measured
            # 1,024 rows of Qwen3-MoE's 3-6 MB experts only, where a Mixtral product of 235 MB at 1,024 rows sits).
            ranked = [g for g in ranked if g.sizes[0] - 1.0 <= f.size <= g.sizes[-1] + 1.0] or ranked
        ranked = ranked[:NEIGHBOURS]
        dists = [math.sqrt(dist2(g)) for g in ranked]
        if dists[0] < 1e-9:
            le, used, out = ranked[0].at(f.size)
            return le, used + _borrowed(ranked[0]), out
        weights = [1.0 / d**2 for d in dists]
        total = sum(weights)
        le = 0.0
        names = []
        outs = []
        for g, w in zip(ranked, weights, strict=True):
            v, used, out = g.at(f.size)
            if log_roof is not None:
                roof_g, elasticity = g.roof_and_elasticity(f.size)
                v += (1.0 - elasticity) * (log_roof - roof_g)
            le += v * w / total
            names.append(f"{used}{_borrowed(g)} (w {w / total:.2f})")
            outs.append(out)
        return le, ", ".join(names), min(outs)


def _borrowed(g: _Group) -> str:
    return f" ({g.dtype.value})" if g.dtype is not None else ""


def default_cost_model(hw: HardwareSpec, **options: object) -> tuple[CostModel, str | None]:
    """The cost model a front end uses when none is named: the device's shipped profile, else the
    datasheet roofline with a one-line note that the device is uncalibrated; built with ``options``
    (``--cost-option``)."""
    from hardware.hostprofile import hardware_host_profile
    from hardware.models.registry import resolve_cost_model

    if hardware_profile(hw) is not None:
        return resolve_cost_model("profile", **options), None
    host = (
        ""
        if hardware_host_profile(hw) is not None
        else "; nor a host profile, so the eager host is the spec's issue time per op with no framework time "
        "between ops (do not compare its wall with a calibrated device's)"
    )
    note = (
        f"{hw.name} is uncalibrated: no measured profile ships with it, so costs come from the datasheet "
        f"roofline (measure one with `opgraph profile --device cuda`){host}"
    )
    return resolve_cost_model("roofline", **options), note


def profile_points(profile: DeviceProfile, regime: str) -> list[ProfilePoint]:
    """The points of ``profile`` in ``regime`` (as :func:`profile_features` names it)."""
    out = []
    for p in profile.points:
        f = profile_features(p.op)
        if f is not None and f.regime == regime and not p.tag:
            out.append(p)
    return out


__all__ = [
    "BROADCAST",
    "FAR",
    "FLOAT_TABLES",
    "STRIDED",
    "UNALIGNED",
    "WRITEBACK_MAX_BYTES",
    "WRITEBACK_TAG",
    "Features",
    "ProfileExtrapolationWarning",
    "ProfileModel",
    "ProfileWritebackWarning",
    "WritebackCurve",
    "broadcast_input",
    "default_cost_model",
    "evicted_dirty_bytes",
    "float_tables",
    "profile_features",
    "profile_points",
    "roofline_seconds",
    "roofline_terms",
    "strided_input",
    "strided_under_broadcast",
    "twin_dtypes",
    "unaligned_gemm",
    "unaligned_rows",
    "writeback_curves",
    "writes_through",
]
