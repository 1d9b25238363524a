"""Operator kinds and one frozen pydantic model per kind, joined in a discriminated union on ``kind``.

Every op carries the common fields of :class:`OpBase` (id, target, tensors, scope, layer, stage,
FLOPs, bytes, definition, how the host issues it) plus the fields that matter for its cost. ``flops``,
``bytes_read``, ``bytes_written`` and ``definition`` are derived from the kind's own fields when not given,
so an op written by hand is complete; capture passes may override them with what they measured.

The ``definition`` is a name, never read for facts about the op: those are typed fields (``issue``,
``Gemm.expert``). Ops saved before those fields existed said them only in the definition; the one legacy
path that reads them back from it is :func:`legacy_facts`, run where an op is validated without them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, Field, JsonValue, model_validator

from opgraph.ir.dtypes import DType
from opgraph.ir.experts import ExpertGemm, legacy_expert
from opgraph.ir.issue import HostIssue, legacy_issue
from opgraph.ir.tensor import FrozenModel, NonNegInt, TensorSpec

IDENTITY_FIELDS: frozenset[str] = frozenset({"id", "scope", "layer", "stage", "step", "host_gap_us"})
"""Op fields that say where and when an op ran, not what it computes: equal configs differ only here."""

PosInt = Annotated[int, Field(ge=1)]
"""An integer that is one or more (dimensions that cannot be empty)."""


class OpKind(str, Enum):
    """What an op computes, at the granularity cost models and replay care about."""

    GEMM = "gemm"
    ATTENTION = "attention"
    NORM = "norm"
    ROPE = "rope"
    EMBEDDING = "embedding"
    ACTIVATION = "activation"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    SOFTMAX = "softmax"
    TOPK = "topk"
    MOE_ROUTING = "moe_routing"
    COLLECTIVE = "collective"
    MEMORY = "memory"
    VIEW = "view"
    OTHER = "other"


class OpCategory:
    """Sets of kinds that behave alike (in the manner of tinygrad's ``GroupOp``)."""

    MATMUL: ClassVar[frozenset[OpKind]] = frozenset({OpKind.GEMM, OpKind.ATTENTION})
    """Kinds that run on tensor cores and can be compute-bound."""
    POINTWISE: ClassVar[frozenset[OpKind]] = frozenset(
        {OpKind.NORM, OpKind.ROPE, OpKind.ACTIVATION, OpKind.ELEMENTWISE, OpKind.SOFTMAX}
    )
    """Vector-unit kinds, usually memory-bound."""
    DATA_MOVEMENT: ClassVar[frozenset[OpKind]] = frozenset({OpKind.MEMORY, OpKind.EMBEDDING})
    """Kinds that mostly move bytes."""
    COMMUNICATION: ClassVar[frozenset[OpKind]] = frozenset({OpKind.COLLECTIVE})
    """Kinds that run on interconnect links."""
    FREE: ClassVar[frozenset[OpKind]] = frozenset({OpKind.VIEW})
    """Kinds that launch no kernel and cost nothing."""


class Stage(str, Enum):
    """Inference stage an op belongs to."""

    PREFILL = "prefill"
    DECODE = "decode"


class AtenCall(FrozenModel):
    """The recorded call of a single-aten op, so replay can run it exactly as the model did.

    Encoding of arguments: a tensor is ``{"tensor": i}`` (index into the op's ``inputs``), a
    dtype is ``{"dtype": "bf16"}``, a list of tensors is a list of such objects; other values
    (ints, floats, bools, strings, None, lists) are stored as they are. Devices are dropped.
    """

    args: tuple[JsonValue, ...] = ()
    """Positional arguments."""
    keywords: dict[str, JsonValue] = Field(default_factory=dict)
    """Keyword arguments."""


class OpBase(FrozenModel):
    """Fields common to every op."""

    kind: OpKind
    """What the op computes; each subclass fixes it (the union's discriminator)."""
    id: NonNegInt
    """Unique id of the op within its graph."""
    target: str = ""
    """What it came from: the aten overload (``aten.mm.default``) or module (``LlamaRMSNorm``)."""
    inputs: tuple[TensorSpec, ...] = ()
    """Tensors read."""
    outputs: tuple[TensorSpec, ...] = ()
    """Tensors written."""
    scope: str = ""
    """Module path the op ran in (``model.layers.3.self_attn``)."""
    layer: int | None = None
    """Transformer layer index, from the scope; ``None`` outside the layers."""
    stage: Stage | None = None
    """Prefill or decode, when known."""
    step: int | None = None
    """Forward pass index in a generate graph: 0 for the prefill, 1.. for decode steps."""
    dtype: DType = DType.bf16
    """Compute dtype."""
    flops: NonNegInt = 0
    """Floating-point operations (a multiply-add counts 2). Derived when not given."""
    bytes_read: NonNegInt = 0
    """Bytes read from memory. Derived when not given."""
    bytes_written: NonNegInt = 0
    """Bytes written to memory. Derived when not given."""
    definition: str = ""
    """Stable flashinfer-bench style name (``gemm_n4096_k4096``) for dedup, replay and tables."""
    call: AtenCall | None = None
    """The aten call as recorded, for ops lowered from one aten op; ``None`` for fused/composite ops."""
    host_gap_us: Annotated[float, Field(ge=0)] | None = None
    """Host time the framework spent before issuing this op (Python, module calls and the views
    folded away since the previous op), measured at capture with ``host_timing``; ``None`` when not
    measured. Eager simulations add it to the op's issue time."""
    issue: HostIssue = HostIssue.CALL
    """How the host issues the op: a Python-level call, nested in the call before it (no framework time
    before it) or a call after which the host waits for the device (:mod:`opgraph.ir.issue`)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_facts(cls, data: Any) -> Any:
        # The legacy path: an op validated without its typed facts (a file written before they were
        # fields, or an op built with a definition only) takes them from its definition's marks.
        if not isinstance(data, dict):
            return data
        definition = data.get("definition")
        if not definition or not isinstance(definition, str):
            return data
        fields = cls.model_fields
        facts = legacy_facts(cls, definition).items()
        missing = {k: v for k, v in facts if k not in data and v != fields[k].default}
        return {**data, **missing} if missing else data

    @model_validator(mode="after")
    def _derive_defaults(self) -> OpBase:
        given = self.model_fields_set
        # The model is frozen; derived defaults are filled once, here, before anyone sees it.
        if "flops" not in given:
            object.__setattr__(self, "flops", max(0, int(self.default_flops())))
        if "bytes_read" not in given or "bytes_written" not in given:
            read, written = self.default_bytes()
            if "bytes_read" not in given:
                object.__setattr__(self, "bytes_read", max(0, int(read)))
            if "bytes_written" not in given:
                object.__setattr__(self, "bytes_written", max(0, int(written)))
        if not self.definition:
            object.__setattr__(self, "definition", self.default_definition())
        return self

    # Hooks each kind overrides.
    def default_flops(self) -> float:
        """FLOPs implied by the kind's fields."""
        return 0

    def default_bytes(self) -> tuple[float, float]:
        """(read, written) bytes implied by the tensors or, without tensors, by :meth:`field_bytes`."""
        if self.inputs or self.outputs:
            return (sum(t.nbytes for t in self.inputs), sum(t.nbytes for t in self.outputs))
        return self.field_bytes()

    def field_bytes(self) -> tuple[float, float]:
        """(read, written) bytes implied by the kind's fields, for an op written without tensors."""
        return (0, 0)

    definition_format: ClassVar[str] = ""
    """Template of the default definition name over the op's fields (``"{fn}_h{hidden}"``), for kinds
    whose name is just their fields; others override :meth:`default_definition`."""

    def default_definition(self) -> str:
        """The definition name implied by the kind's fields."""
        if self.definition_format:
            return self.definition_format.format(**self.__dict__)
        return str(getattr(self, "kind", "op"))

    @property
    def total_bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (``inf`` when no bytes move)."""
        return self.flops / self.total_bytes if self.total_bytes else math.inf


def legacy_facts(op_type: type[OpBase], definition: str) -> dict[str, Any]:
    """The typed facts that an op of ``op_type`` saved before they were fields says in its definition
    (``@nested``/``@sync`` marks, an expert GEMM's ``moe_{impl}_e{E}_..._topk{K}_{part}`` name): the one
    place that reads them from a definition (:func:`~opgraph.ir.issue.legacy_issue`,
    :func:`~opgraph.ir.experts.legacy_expert`). An op validated without a field takes its value from
    here, and :func:`~opgraph.ir.configs.config_key` leaves out the fields that hold it, so the key of an
    op is the key it had before the fields existed.

    >>> legacy_facts(Gemm, "moe_bmm_e4_h8_topk2_down")["expert"].impl.value
    'bmm'
    >>> legacy_facts(Norm, "rmsnorm_h64")
    {'issue': <HostIssue.CALL: 'call'>}
    """
    facts: dict[str, Any] = {"issue": legacy_issue(definition)}
    if "expert" in op_type.model_fields:
        facts["expert"] = legacy_expert(definition) if definition.startswith("moe_") else None
    return facts


def _isz(dtype: DType) -> float:
    return dtype.itemsize


class Gemm(OpBase):
    """A matrix multiply ``[batch][groups] (m x k) @ (k x n)``: linear, mm, addmm, bmm, grouped mm."""

    kind: Literal[OpKind.GEMM] = OpKind.GEMM
    m: NonNegInt
    """Rows of the output (tokens for a linear layer)."""
    n: PosInt
    """Columns of the output (output features)."""
    k: PosInt
    """Reduction size (input features)."""
    batch: PosInt = 1
    """Independent batched products (bmm)."""
    groups: PosInt = 1
    """Grouped GEMM groups (MoE experts); ``m`` is then the mean rows per group."""
    out_dtype: DType | None = None
    """Output dtype when it differs from ``dtype``."""
    bias: bool = False
    """An added bias vector (addmm, linear with bias)."""
    expert: ExpertGemm | None = None
    """What makes the op an expert GEMM of a mixture-of-experts layer (its experts implementation, the
    layer's experts and top-k, the projection); ``None`` for a dense GEMM."""

    def default_flops(self) -> float:
        return (2 * self.m * self.n * self.k + (self.m * self.n if self.bias else 0)) * self.batch * self.groups

    def field_bytes(self) -> tuple[float, float]:
        mult = self.batch * self.groups
        out = _isz(self.out_dtype or self.dtype)
        read = (self.m * self.k + self.k * self.n) * _isz(self.dtype) * mult + (self.n * out if self.bias else 0)
        return (read, self.m * self.n * out * mult)

    @property
    def accumulates(self) -> bool:
        """It adds its product onto a third operand the shape of its output, which it reads (``baddbmm``
        with ``beta`` not 0: BLOOM's alibi scores, after the addend's copy)."""
        return len(self.inputs) == 3 and tuple(self.inputs[2].shape) == (self.batch, self.m, self.n)

    def default_definition(self) -> str:
        if self.groups > 1:
            return f"grouped_gemm_e{self.groups}_n{self.n}_k{self.k}"
        if self.batch > 1:
            return f"bmm_b{self.batch}_n{self.n}_k{self.k}"
        return f"gemm_n{self.n}_k{self.k}"


class AttentionVariant(str, Enum):
    """Attention head layout."""

    MHA = "mha"
    GQA = "gqa"
    MQA = "mqa"
    MLA = "mla"


def attended_pairs(q_len: int, kv_len: int, causal: bool, window: int | None = None) -> int:
    """Query-key pairs one head computes: ``q_len * kv_len`` less what causal masking and a window skip.

    Query ``i`` sits at position ``kv_len - q_len + i`` and, when causal, sees keys up to and
    including its own position; a sliding ``window`` caps each query's keys at ``window``.
    """
    if not causal:
        per_query = kv_len if window is None else min(kv_len, window)
        return q_len * per_query
    first = kv_len - q_len + 1  # keys seen by the first query
    if window is None:
        return q_len * first + q_len * (q_len - 1) // 2
    total = 0
    # Seen keys grow by one per query until they reach the window, then stay there.
    grow = max(0, min(q_len, window - first + 1)) if first <= window else 0
    if grow:
        total += grow * first + grow * (grow - 1) // 2
    total += (q_len - grow) * window
    return total


class EagerPass(FrozenModel):
    """One kernel that eager attention runs over its materialised scores besides its two matmuls (a
    scale, a mask, a cast, a softmax, a row maximum, a sinks ``cat``...), as capture saw it.

    Its bytes are per score (``batch * heads * q_len * kv_len`` of them) and per query row (``batch *
    heads * q_len``: a row maximum, a sink column), so they follow the attention's shape when a transform
    changes it."""

    kind: Literal[OpKind.ELEMENTWISE, OpKind.SOFTMAX, OpKind.REDUCTION, OpKind.MEMORY]
    """What kind of kernel it is (how a cost model prices it)."""
    fn: str
    """The aten function (``mul``, ``add``, ``_softmax``, ``max``...); a memory pass as the memory lowering
    names it (``cast``, ``copy``, ``cat``)."""
    read: Annotated[float, Field(ge=0)]
    """Bytes it reads per score."""
    written: Annotated[float, Field(ge=0)]
    """Bytes it writes per score."""
    read_row: Annotated[float, Field(ge=0)] = 0.0
    """Bytes it reads per query row besides those (a sinks column)."""
    written_row: Annotated[float, Field(ge=0)] = 0.0
    """Bytes it writes per query row besides those (a row maximum, a sinks column)."""
    dtype: DType = DType.bf16
    """The dtype it computes in (a softmax taken in float32: ``fp32``); a memory pass's, the dtype it reads,
    as a graph's :class:`Memory` op (a cast of float32 probabilities back to bfloat16: ``fp32``)."""
    extra_cols: NonNegInt = 0
    """Columns its rows hold beyond the keys (gpt-oss's sinks column, from the ``cat`` that adds it on):
    a row of ``kv_len + extra_cols``, which decides the kernel a row-wise pass runs."""
    broadcast: bool = False
    """It reads an operand broadcast over the scores (a mask over the heads, a row maximum over its row,
    sinks expanded over the queries): a strided kernel, not the flat one."""
    addend: bool = False
    """It is the copy a ``baddbmm`` makes of its addend (BLOOM's alibi, broadcast over the queries) into the
    scores before its matmul, which then reads them back (a memory pass named ``addend``): it runs first,
    and the scores matmul reads the bytes it wrote."""


class Attention(OpBase):
    """Scaled dot-product attention of ``heads`` query heads over ``kv_heads`` key/value heads."""

    kind: Literal[OpKind.ATTENTION] = OpKind.ATTENTION
    batch: PosInt
    """Sequences."""
    q_len: PosInt
    """Query tokens per sequence."""
    kv_len: PosInt
    """Key/value tokens per sequence (cache plus new tokens)."""
    heads: PosInt
    """Query heads."""
    kv_heads: PosInt
    """Key/value heads."""
    head_dim: PosInt
    """Query/key head size."""
    head_dim_v: PosInt | None = None
    """Value head size when it differs from ``head_dim`` (MLA)."""
    causal: bool = True
    """Causal masking."""
    window: PosInt | None = None
    """Sliding-window size, when the layer uses one: a query sees at most this many keys (a window no
    shorter than ``kv_len`` masks nothing)."""
    variant: AttentionVariant = AttentionVariant.GQA
    """Head layout."""
    eager: tuple[EagerPass, ...] | None = None
    """``None``: one fused kernel (SDPA, flash). Otherwise the model's eager attention: a batched matmul
    of queries and keys over every query-key pair, these passes over the scores it materialises, then a
    batched matmul of the weights and values (:func:`eager_parts` lists the kernels)."""
    math: bool = False
    """The call runs on SDPA's math path (no fused kernel takes it: keys of fewer heads than the queries
    without ``enable_gqa``, as Falcon's multi-query attention calls it): ``eager`` holds the passes over the
    scores, the matmuls run in float32, and the inputs are cast to float32 and scaled first
    (:func:`eager_parts`)."""

    @model_validator(mode="after")
    def _check_shapes(self) -> Attention:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if self.q_len > self.kv_len:
            raise ValueError(f"q_len ({self.q_len}) exceeds kv_len ({self.kv_len})")
        return self

    @property
    def dv(self) -> int:
        """Value head size."""
        return self.head_dim_v or self.head_dim

    @property
    def window_full(self) -> bool:
        """Whether the keys fill the sliding window: transformers then gives SDPA a mask (it leaves it out
        only while the keys are fewer than the window), whether or not the mask hides any key. A sliding
        layer's cache keeps ``window - 1`` keys, so every decode past the window sees exactly ``window``.

        >>> Attention(id=0, batch=1, q_len=1, kv_len=4096, heads=8, kv_heads=8, head_dim=64, window=4096).window_full
        True
        """
        return self.window is not None and self.kv_len >= self.window

    @property
    def pairs(self) -> int:
        """Query-key pairs per head after masking."""
        return attended_pairs(self.q_len, self.kv_len, self.causal, self.window)

    def default_flops(self) -> float:
        # eager attention multiplies every query-key pair; the mask only zeroes weights afterwards
        pairs = self.q_len * self.kv_len if self.eager is not None else self.pairs
        return 2 * self.batch * self.heads * pairs * (self.head_dim + self.dv)

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        q = self.batch * self.q_len * self.heads * self.head_dim
        kv = self.batch * self.kv_len * self.kv_heads * (self.head_dim + self.dv)
        return ((q + kv) * s, self.batch * self.q_len * self.heads * self.dv * s)

    def default_definition(self) -> str:
        v = ("eager_" if self.eager is not None else "") + self.variant.value
        if self.q_len == 1:
            name = f"{v}_paged_decode_h{self.heads}_kv{self.kv_heads}_d{self.head_dim}"
        else:
            mask = "causal" if self.causal else "full"
            name = f"{v}_ragged_prefill_{mask}_h{self.heads}_kv{self.kv_heads}_d{self.head_dim}"
        if self.dv != self.head_dim:
            name += f"_dv{self.dv}"
        if self.window and self.window < self.kv_len:  # a window that masks nothing runs the plain kernel
            name += f"_w{self.window}"
        return name


class NormVariant(str, Enum):
    """Normalisation flavour."""

    RMS = "rms"
    LAYER = "layer"


class Norm(OpBase):
    """RMSNorm or LayerNorm over the last ``hidden`` elements of ``rows`` rows."""

    kind: Literal[OpKind.NORM] = OpKind.NORM
    rows: NonNegInt
    hidden: PosInt
    variant: NormVariant = NormVariant.RMS

    def default_flops(self) -> float:
        return (4 if self.variant is NormVariant.RMS else 7) * self.rows * self.hidden

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        return ((self.rows + 1) * self.hidden * s, self.rows * self.hidden * s)

    def default_definition(self) -> str:
        return f"{'rmsnorm' if self.variant is NormVariant.RMS else 'layernorm'}_h{self.hidden}"


class Rope(OpBase):
    """Rotary position embedding applied to ``heads`` heads of ``tokens`` tokens."""

    kind: Literal[OpKind.ROPE] = OpKind.ROPE
    tokens: NonNegInt
    heads: PosInt
    head_dim: PosInt
    rotary_dim: PosInt | None = None
    """Rotated part of each head (partial rotary); ``None`` means the whole head."""

    def default_definition(self) -> str:
        """``rope_h{heads}_d{head_dim}``, with ``_r{rotary_dim}`` where only part of each head rotates (its
        FLOPs and bytes differ from a whole head's)."""
        partial = self.rotary_dim is not None and self.rotary_dim < self.head_dim
        return f"rope_h{self.heads}_d{self.head_dim}" + (f"_r{self.rotary_dim}" if partial else "")

    def default_flops(self) -> float:
        return 3 * self.tokens * self.heads * (self.rotary_dim or self.head_dim)

    def field_bytes(self) -> tuple[float, float]:
        n = self.tokens * self.heads * self.head_dim * _isz(self.dtype)
        return (n + 2 * self.tokens * (self.rotary_dim or self.head_dim) * _isz(self.dtype), n)


class Embedding(OpBase):
    """Token embedding lookup: ``tokens`` rows gathered from a ``vocab x hidden`` table."""

    kind: Literal[OpKind.EMBEDDING] = OpKind.EMBEDDING
    definition_format: ClassVar[str] = "embedding_v{vocab}_d{hidden}"
    tokens: NonNegInt
    vocab: PosInt
    hidden: PosInt

    def default_bytes(self) -> tuple[float, float]:
        # The table is an input but only the gathered rows (and their int64 ids) are read.
        row = self.hidden * _isz(self.dtype)
        return (self.tokens * (row + 8), self.tokens * row)


class Activation(OpBase):
    """A nonlinearity (SiLU, GELU, ...), optionally gated (SwiGLU: ``act(gate) * up``)."""

    kind: Literal[OpKind.ACTIVATION] = OpKind.ACTIVATION
    definition_format: ClassVar[str] = "{fn}_h{hidden}"
    fn: str
    """Function name: ``silu``, ``gelu``, ``gelu_tanh``, ``relu``, ``sigmoid``, ``tanh``, ``swiglu``."""
    numel: NonNegInt
    """Output elements."""
    hidden: PosInt
    """Size of the last dimension."""
    gated: bool = False
    """Multiplied by a second input (GLU family)."""

    def default_flops(self) -> float:
        per = {"relu": 1, "silu": 4, "sigmoid": 4, "tanh": 4, "gelu": 8, "gelu_tanh": 8}.get(self.fn, 4)
        return self.numel * (per + (1 if self.gated else 0))

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        return (self.numel * s * (2 if self.gated else 1), self.numel * s)


SCALAR_OPERAND_FNS = frozenset(
    {"add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "pow", "remainder", "fmod"}
)
"""Binary elementwise functions whose second operand may be a scalar (:attr:`Elementwise.scalar`)."""


def scalar_operand(fn: str, operand_numels: Sequence[int], out_numel: int) -> bool:
    """Whether an elementwise ``fn`` whose tensor operands hold ``operand_numels`` elements takes a scalar
    (:attr:`Elementwise.scalar`): a function of :data:`SCALAR_OPERAND_FNS` with one operand of more than one
    element, writing more than one (``x * 0.125``; a Python number is no tensor operand).

    >>> scalar_operand("mul", (4096,), 4096), scalar_operand("mul", (4096, 4096), 4096)
    (True, False)
    """
    return fn in SCALAR_OPERAND_FNS and out_numel > 1 and sum(n > 1 for n in operand_numels) == 1


class Elementwise(OpBase):
    """A pointwise arithmetic op (add, mul, ...) over ``numel`` output elements.

    Its fields count two tensor operands read (``scalar``: one) and one written, as the profile's points
    of the same function were measured.

    >>> Elementwise(id=0, fn="mul", numel=8, hidden=4, scalar=True).field_bytes()
    (16, 16)
    """

    kind: Literal[OpKind.ELEMENTWISE] = OpKind.ELEMENTWISE
    fn: str
    """The aten function name (``add``, ``mul``, ``rsqrt``, ``where``)."""
    numel: NonNegInt
    hidden: PosInt = 1
    """Size of the last dimension of the output."""
    scalar: bool = False
    """Its second operand is a scalar (a Python number or a one-element tensor: eager attention's
    ``scores * scaling``), so it reads one tensor, not two, in another kernel (a function of
    :data:`SCALAR_OPERAND_FNS`)."""

    def default_definition(self) -> str:
        return f"{self.fn}{'_scalar' if self.scalar else ''}_h{self.hidden}"

    def default_flops(self) -> float:
        return self.numel

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        return ((1 if self.scalar else 2) * self.numel * s, self.numel * s)


class Reduction(OpBase):
    """A reduction (sum, mean, max, norm) from ``numel_in`` to ``numel_out`` elements."""

    kind: Literal[OpKind.REDUCTION] = OpKind.REDUCTION
    definition_format: ClassVar[str] = "{fn}_d{reduced}"
    fn: str
    numel_in: NonNegInt
    numel_out: NonNegInt
    reduced: PosInt = 1
    """Elements folded into each output."""

    def default_flops(self) -> float:
        return self.numel_in

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        return (self.numel_in * s, self.numel_out * s)


class Softmax(OpBase):
    """Softmax over the last ``cols`` elements of ``rows`` rows."""

    kind: Literal[OpKind.SOFTMAX] = OpKind.SOFTMAX
    rows: NonNegInt
    cols: PosInt
    masked: bool = False
    """Its rows are a causal prefill's scores, the mask's fill value past the diagonal (eager attention's):
    data on which CUDA's softmax kernels run longer than on unmasked rows (1.2-1.35x for half input)."""

    def default_definition(self) -> str:
        return f"softmax{'_masked' if self.masked else ''}_d{self.cols}"

    def default_flops(self) -> float:
        return 5 * self.rows * self.cols

    def field_bytes(self) -> tuple[float, float]:
        n = self.rows * self.cols * _isz(self.dtype)
        return (n, n)


class TopK(OpBase):
    """Top-k, argmax, sort or sampling over the last ``cols`` elements of ``rows`` rows."""

    kind: Literal[OpKind.TOPK] = OpKind.TOPK
    fn: str = "topk"
    """``topk``, ``argmax``, ``sort``, ``multinomial``."""
    rows: NonNegInt
    cols: PosInt
    k: PosInt = 1

    def default_flops(self) -> float:
        return self.rows * self.cols * max(1.0, math.log2(max(self.k, 2)))

    def field_bytes(self) -> tuple[float, float]:
        return (self.rows * self.cols * _isz(self.dtype), self.rows * self.k * (_isz(self.dtype) + 8))

    def default_definition(self) -> str:
        if self.fn == "topk":
            return f"topk_d{self.cols}_k{self.k}"
        return f"{self.fn}_d{self.cols}"


class MoeRouting(OpBase):
    """Expert routing of a mixture-of-experts layer: scores to top-k experts per token, and dispatch."""

    kind: Literal[OpKind.MOE_ROUTING] = OpKind.MOE_ROUTING
    definition_format: ClassVar[str] = "moe_{fn}_e{experts}_topk{top_k}"
    fn: str = "route"
    """``route`` (softmax/sigmoid + top-k), ``dispatch`` (gather tokens), ``combine`` (scatter-add)."""
    tokens: NonNegInt
    experts: PosInt
    top_k: PosInt
    hidden: PosInt = 1
    masked: bool = False
    """The experts code masks expert-parallel sentinel rows on this step (``dispatch``: the mask of
    sorted expert ids past the last expert, the ids clamped in place, the gathered rows zeroed where
    masked; ``combine``: the expert output zeroed where masked before the weighting). Transformers
    5.17's ``grouped_mm`` experts do so on every call; from 5.18 only under expert parallelism."""

    @property
    def weights_dtype(self) -> DType:
        """The routing weights' dtype: that of an input holding one float per token-expert pair in
        another dtype than the op's (Mixtral keeps them in float32, so its combine weights, gathers and
        sums in float32 before casting back; Qwen3-MoE casts them to the hidden dtype), else the op's.

        >>> w = TensorSpec(shape=(8, 1), dtype=DType.fp32)
        >>> MoeRouting(id=0, fn="combine", tokens=4, experts=8, top_k=2, hidden=16, inputs=(w,)).weights_dtype.value
        'fp32'
        >>> MoeRouting(id=0, fn="combine", tokens=4, experts=8, top_k=2, hidden=16).weights_dtype.value
        'bf16'
        """
        pairs = self.tokens * self.top_k
        for t in self.inputs:
            if t.dtype.is_float and t.dtype is not self.dtype and math.prod(t.shape) == pairs:
                return t.dtype
        return self.dtype

    def default_flops(self) -> float:
        if self.fn == "route":
            return self.tokens * self.experts * 6
        return self.tokens * self.top_k * self.hidden

    def field_bytes(self) -> tuple[float, float]:
        s = _isz(self.dtype)
        if self.fn == "route":
            return (self.tokens * self.experts * s, self.tokens * self.top_k * (s + 8))
        pairs = self.tokens * self.top_k
        n = pairs * self.hidden * s
        if not self.masked:
            return (n, n)
        # The mask pass over the S = tokens * top_k rows: a masked_fill reads the rows and the bool
        # mask and writes the rows; a dispatch also builds the mask from the int64 sorted ids (ge)
        # and clamps the ids in place (clamp_).
        if self.fn == "dispatch":
            return (2 * n + pairs * (1 + 8 + 8), 2 * n + pairs * (1 + 8))
        return (2 * n + pairs, 2 * n)


class CollectiveKind(str, Enum):
    """Communication pattern of a collective."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"


def collective_definition(collective: CollectiveKind, group_size: int, nbytes: int) -> str:
    """The definition name of a collective (``all_reduce_g4_b65536``): the one spelling shared by the
    graph's :class:`Collective` ops and the collective sweeps and tables that match them."""
    return f"{collective.value}_g{group_size}_b{nbytes}"


class Collective(OpBase):
    """A multi-device collective over ``group_size`` ranks moving ``bytes`` per rank."""

    kind: Literal[OpKind.COLLECTIVE] = OpKind.COLLECTIVE
    collective: CollectiveKind
    bytes: NonNegInt
    """Payload per rank (the input buffer size)."""
    group_size: PosInt

    def default_flops(self) -> float:
        if self.collective in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
            return self.bytes / _isz(self.dtype) * (self.group_size - 1) / self.group_size
        return 0

    def default_bytes(self) -> tuple[float, float]:
        return (self.bytes, self.bytes)

    def default_definition(self) -> str:
        return collective_definition(self.collective, self.group_size, self.bytes)


class Memory(OpBase):
    """Data movement with no arithmetic: copy, cast, cat, index, scatter, KV-cache write, fill."""

    kind: Literal[OpKind.MEMORY] = OpKind.MEMORY
    definition_format: ClassVar[str] = "{fn}_n{numel}"
    fn: str
    """``copy``, ``cast``, ``cat``, ``index``, ``index_put``, ``scatter``, ``kv_cache_write``, ``fill``,
    ``repeat_kv`` (an expanded view copied), ``addend`` (a ``baddbmm``'s broadcast addend copied into its
    output)..."""
    numel: NonNegInt
    """Elements written."""

    def field_bytes(self) -> tuple[float, float]:
        n = self.numel * _isz(self.dtype)
        return (0 if self.fn == "fill" else n, n)


class View(OpBase):
    """A view, reshape or metadata op that launches no kernel."""

    kind: Literal[OpKind.VIEW] = OpKind.VIEW
    definition_format: ClassVar[str] = "view_{fn}"
    fn: str = "view"

    def default_bytes(self) -> tuple[float, float]:
        return (0, 0)


class Other(OpBase):
    """Anything the lowering passes do not recognise; kept so its cost is reported, not lost."""

    kind: Literal[OpKind.OTHER] = OpKind.OTHER
    fn: str = ""
    """The aten function or module name."""

    def default_definition(self) -> str:
        return self.fn or self.target or "other"


Op = Annotated[
    Union[
        Gemm,
        Attention,
        Norm,
        Rope,
        Embedding,
        Activation,
        Elementwise,
        Reduction,
        Softmax,
        TopK,
        MoeRouting,
        Collective,
        Memory,
        View,
        Other,
    ],
    Field(discriminator="kind"),
]
"""Any op: a discriminated union on ``kind``."""

OP_TYPES: dict[OpKind, type[OpBase]] = {cls.model_fields["kind"].default: cls for cls in get_args(get_args(Op)[0])}
"""The model class of each kind."""


def _broadcast_operands(op: Attention, p: EagerPass) -> tuple[TensorSpec, ...]:
    """The operands of a pass that reads one broadcast over the scores ``[batch, heads, q_len, cols]``: the
    scores, then a ``cat``'s sink column expanded over the queries, an operand the size of a share of the
    scores (a mask over the heads: stride 0 over them), or a row's statistic (stride 0 over its columns)."""
    b, h, q = op.batch, op.heads, op.q_len
    cols = op.kv_len + p.extra_cols
    if p.addend:  # a baddbmm's addend, broadcast over the queries, copied into the scores it is the size of
        return (TensorSpec(shape=(b, h, q, cols), dtype=p.dtype, strides=(h * cols, cols, 0, 1)),)
    scores = TensorSpec(shape=(b, h, q, op.kv_len if p.kind is OpKind.MEMORY else cols), dtype=p.dtype)
    if p.kind is OpKind.MEMORY:  # the cat's own input: the scores before the column it adds
        other = TensorSpec(shape=(b, h, q, p.extra_cols or 1), dtype=p.dtype, strides=(0, 1, 0, 1))
    elif p.read > p.dtype.itemsize:
        other = TensorSpec(shape=(b, h, q, cols), dtype=p.dtype, strides=(q * cols, 0, cols, 1))
    else:
        other = TensorSpec(shape=(b, h, q, cols), dtype=p.dtype, strides=(h * q, q, 1, 0))
    return (scores, other)


def eager_parts(op: Attention) -> tuple[OpBase, ...]:
    """The kernels an eager attention op runs (``()`` for a fused one), as ops a cost model prices one by
    one: the scores' batched matmul, each :class:`EagerPass` over the scores in order, the values'
    batched matmul; a ``baddbmm``'s addend copy (:attr:`EagerPass.addend`) comes first, and the scores'
    matmul then accumulates onto it. A causal prefill's softmax is ``masked``. A call on SDPA's math path
    (:attr:`Attention.math`) runs its matmuls in float32, after its inputs' casts and scales and, where one key
    head serves several sequences' query heads, copies of the keys and values to every head; its output is
    cast back last. Their shapes follow the op's fields (a rebatched or sharded op's parts are its own).

    >>> att = Attention(id=0, batch=1, q_len=4, kv_len=4, heads=2, kv_heads=2, head_dim=8,
    ...                 eager=(EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=2, written=2),))
    >>> [(p.kind.value, p.definition) for p in eager_parts(att)]
    [('gemm', 'bmm_b2_n4_k8'), ('softmax', 'softmax_masked_d4'), ('gemm', 'bmm_b2_n8_k4')]
    """
    if op.eager is None:
        return ()
    bh, rows = op.batch * op.heads, op.batch * op.heads * op.q_len
    scores = rows * op.kv_len
    common: dict[str, Any] = {"id": op.id, "scope": op.scope, "layer": op.layer, "stage": op.stage, "step": op.step}
    front, back, mm_dtype = _math_ends(op, common) if op.math else ((), (), op.dtype)
    before: list[OpBase] = []  # a baddbmm's addend, copied into the scores before its matmul
    after: list[OpBase] = []
    for p in op.eager:
        cols = op.kv_len + p.extra_cols
        sized: dict[str, Any] = {
            **common,
            "dtype": p.dtype,
            "bytes_read": round(p.read * scores + p.read_row * rows),
            "bytes_written": round(p.written * scores + p.written_row * rows),
        }
        ins = _broadcast_operands(op, p) if p.broadcast else ()
        part: OpBase
        if p.kind is OpKind.SOFTMAX:
            # softmax(x, dtype=float32) of half scores: one kernel that reads them (half_to_float)
            half = p.read < p.dtype.itemsize
            ends = (TensorSpec(shape=(rows, cols), dtype=DType.fp16), TensorSpec(shape=(rows, cols), dtype=p.dtype))
            masked = op.causal and op.q_len > 1  # a prefill's rows hold the causal mask's fill value
            part = Softmax(rows=rows, cols=cols, masked=masked, inputs=ends[:1] if half else (),
                           outputs=ends[1:] if half else (), **sized)  # fmt: skip
        elif p.kind is OpKind.REDUCTION:
            part = Reduction(fn=p.fn, numel_in=rows * cols, numel_out=rows, reduced=cols, **sized)
        elif p.kind is OpKind.MEMORY:
            # what it writes: a cast of float32 weights back to half writes the op's dtype
            narrowed = p.fn == "cast" and p.written < p.read and op.dtype.itemsize == p.written
            row = TensorSpec(shape=(op.batch, op.heads, op.q_len, cols), dtype=op.dtype if narrowed else p.dtype)
            part = Memory(fn=p.fn, numel=rows * cols, inputs=ins, outputs=(row,), **sized)
        else:
            # a scale by a Python number reads the scores alone
            scalar = p.fn in SCALAR_OPERAND_FNS and not p.broadcast and p.read <= p.dtype.itemsize
            part = Elementwise(fn=p.fn, numel=rows * cols, hidden=cols, scalar=scalar, inputs=ins, **sized)
        (before if p.addend else after).append(part)
    tensors: dict[str, Any] = {}
    if before:  # the matmul accumulates onto what the copy wrote (baddbmm's beta): a third operand it reads
        q = TensorSpec(shape=(bh, op.q_len, op.head_dim), dtype=op.dtype)
        k = TensorSpec(shape=(bh, op.head_dim, op.kv_len), dtype=op.dtype)
        acc = TensorSpec(shape=(bh, op.q_len, op.kv_len), dtype=op.dtype)
        tensors = {"inputs": (q, k, acc), "outputs": (acc,)}
    values_in: dict[str, Any] = {}
    if op.math:
        tensors, values_in = _math_operands(op)
    scores_mm = Gemm(m=op.q_len, n=op.kv_len, k=op.head_dim, batch=bh, dtype=mm_dtype, **tensors, **common)
    values = Gemm(m=op.q_len, n=op.dv, k=op.kv_len, batch=bh, dtype=mm_dtype, **values_in, **common)
    if op.eager and op.eager[-1].extra_cols:
        # the weights over the keys sliced out of wider rows (gpt-oss drops its sinks column): a view whose
        # rows lie kv_len + extra_cols apart (recorded as the operand; the bytes stay the fields')
        width = op.kv_len + op.eager[-1].extra_cols
        sliced = TensorSpec(shape=(bh, op.q_len, op.kv_len), dtype=op.dtype, strides=(op.q_len * width, width, 1))
        values = values.model_copy(update={"inputs": (sliced,)})
    return (*front, *before, scores_mm, *after, values, *back)


SDPA_MATH_PASSES: tuple[EagerPass, ...] = (
    EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=4, written=4, dtype=DType.fp32),
    EagerPass(kind=OpKind.ELEMENTWISE, fn="isneginf", read=4, written=1, dtype=DType.fp32),
    EagerPass(kind=OpKind.REDUCTION, fn="all", read=1, written=0, written_row=1, dtype=DType.bool),
    EagerPass(kind=OpKind.ELEMENTWISE, fn="where", read=4, written=4, read_row=1, dtype=DType.fp32, broadcast=True),
)
"""The passes of SDPA's math path over its float32 scores after the mask: ``_safe_softmax``, which CUDA runs as
a softmax, ``isneginf``, a row-wise ``all`` and a ``where`` that zeroes fully masked rows."""


def sdpa_math_passes(*, mask_bytes: float, heads: int, half: bool) -> tuple[EagerPass, ...]:
    """The :attr:`Attention.eager` passes of a call on SDPA's math path: the mask added to the float32 scores
    (``mask_bytes`` a score, read broadcast over the ``heads``; 0: no mask), :data:`SDPA_MATH_PASSES`, and the
    weights cast back to half inputs' dtype (``half``), which the math path returns beside the output.

    >>> [p.fn for p in sdpa_math_passes(mask_bytes=1, heads=8, half=True)]
    ['add', '_softmax', 'isneginf', 'all', 'where', 'cast']
    """
    add = EagerPass(
        kind=OpKind.ELEMENTWISE, fn="add", read=4 + mask_bytes / heads, written=4, dtype=DType.fp32, broadcast=True
    )
    mask = (add,) if mask_bytes else ()
    cast = (EagerPass(kind=OpKind.MEMORY, fn="cast", read=4, written=2, dtype=DType.fp32),) if half else ()
    return (*mask, *SDPA_MATH_PASSES, *cast)


def _math_operands(op: Attention) -> tuple[dict[str, Any], dict[str, Any]]:
    """The float32 operands of the math path's two matmuls: the scaled keys read through their transpose and
    the values, both viewed over every query head with a batch stride of 0 where one key head serves a single
    sequence's heads (``expand`` then ``view``), else copied out (:func:`_math_ends`)."""
    f32, bh = DType.fp32, op.batch * op.heads
    shared = op.batch == 1 and op.kv_heads == 1 and op.heads > 1
    q = TensorSpec(shape=(bh, op.q_len, op.head_dim), dtype=f32)
    keys = TensorSpec(shape=(bh, op.head_dim, op.kv_len), dtype=f32, strides=(0, 1, op.head_dim) if shared else None)
    weights = TensorSpec(shape=(bh, op.q_len, op.kv_len), dtype=f32)
    values = TensorSpec(shape=(bh, op.kv_len, op.dv), dtype=f32, strides=(0, op.dv, 1) if shared else None)
    return {"inputs": (q, keys)}, {"inputs": (weights, values)}


def _math_ends(op: Attention, common: dict[str, Any]) -> tuple[tuple[OpBase, ...], tuple[OpBase, ...], DType]:
    """SDPA's math path around its matmuls (``aten._scaled_dot_product_attention_math``): half inputs cast to
    float32; the queries and the transposed keys scaled by ``head_dim ** -0.25`` each; where the keys and
    values are broadcast over the query heads of more than one sequence, copies of them expanded to every
    head (``matmul`` cannot fold the broadcast into its batch); and the output cast back. ``common``: the
    fields each part takes from the op (its id and where it sits)."""
    f32 = DType.fp32
    half = op.dtype is not f32 and op.dtype.is_float
    q = op.batch * op.heads * op.q_len * op.head_dim
    k = op.batch * op.kv_heads * op.kv_len * op.head_dim
    v = op.batch * op.kv_heads * op.kv_len * op.dv
    front: list[OpBase] = []
    if half:
        front += [
            Memory(fn="cast", numel=n, dtype=op.dtype, outputs=(TensorSpec(shape=(n,), dtype=f32),),
                   bytes_read=n * op.dtype.itemsize, bytes_written=4 * n, **common)
            for n in (q, k, v)
        ]  # fmt: skip
    front += [Elementwise(fn="mul", numel=n, hidden=op.head_dim, scalar=True, dtype=f32, **common) for n in (q, k)]
    if op.batch > 1 and op.kv_heads < op.heads:
        # the scaled keys are read through their transpose ([.., head_dim, kv_len] of [.., kv_len, head_dim]
        # memory), the values as they lie
        g, kvh, kv, dk, dv = op.heads // op.kv_heads, op.kv_heads, op.kv_len, op.head_dim, op.dv
        copies = (
            ((op.batch, kvh, g, dk, kv), (kvh * kv * dk, kv * dk, 0, 1, dk)),
            ((op.batch, kvh, g, kv, dv), (kvh * kv * dv, kv * dv, 0, dv, 1)),
        )
        for (shape, strides), d in zip(copies, (dk, dv), strict=True):
            src = TensorSpec(shape=shape, dtype=f32, strides=strides)
            front.append(Memory(fn="copy", numel=op.batch * op.heads * kv * d, dtype=f32, inputs=(src,),
                                outputs=(TensorSpec(shape=shape, dtype=f32),), **common))  # fmt: skip
    out = op.batch * op.heads * op.q_len * op.dv
    back = (Memory(fn="cast", numel=out, dtype=f32, outputs=(TensorSpec(shape=(out,), dtype=op.dtype),),
                   bytes_read=4 * out, bytes_written=out * op.dtype.itemsize, **common),)  # fmt: skip
    return tuple(front), back if half else (), f32


class _OpAdapter(BaseModel):
    op: Op


def parse_op(data: object) -> OpBase:
    """Validate one op from a dict (or JSON-compatible object), dispatching on ``kind``."""
    return _OpAdapter.model_validate({"op": data}).op
