"""``opgraph profile``: a sweep of synthetic op configs replayed on one device into a device profile.

The sweep (:func:`sweep_points`) covers the regimes real models reach: GEMMs from ``m = 1`` to
``16k`` over the ``(n, k)`` of Llama 1B/8B/70B, Qwen2.5 and the attention and expert shapes of
Qwen3-MoE and Mixtral (bf16, a few fp16 and fp32), attention decode and prefill over lengths,
batch, heads, head size and GQA ratio (causal, full, chunked and sliding-window), norms, RoPE,
activations, elementwise ops, softmax, copies, casts, concatenations, KV-cache writes, embedding
lookups, MoE routing, dispatch, grouped expert GEMMs and combine as the HF implementations run
them (the eager loop's expert products also over the expert shapes of Qwen3-235B, gpt-oss and
Phi-3.5-MoE), and an empty-ish kernel for the launch floor and the host time per aten call.

Each point is replayed through the replay recipes and timer (:class:`~validators.Replayer`): cold
L2 with the op's activations read back, as in a model run (:func:`sweep_timing`), no numeric
check. Points are ordered coarse to fine (:func:`order_points`: the ends and middle of every size
axis first) so a sweep stopped at its time budget still spans every regime; each result is
appended to a JSONL parts file as it completes (``--resume`` carries on from it, skipping a cut
last line) and the :class:`~hardware.profile.DeviceProfile` is written at the end.

A compute-bound point's time moves with the GPU's power state (on an H100 a large GEMM runs 1.18 ms
from idle and 1.30-1.34 ms at the median, single calls up to 1.6 ms, at the 700 W limit; re-measured at
another moment of a sweep, such points differ by 3.5% at the median and 11% at the 90th percentile,
memory-bound ones by 0.2%: ``benchmarks/results/gpu/h100/thermal/``). The sweep measures those points
again after it, in :data:`REPEAT_PASSES` passes in all (:func:`repeat_plan`), and keeps the median.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hardware.models.profile import WRITEBACK_MAX_BYTES, WRITEBACK_TAG
from hardware.profile import (
    DeviceProfile,
    ProfileDevice,
    ProfilePoint,
    fastest_ref,
    parts_path,
    read_parts,
)
from hardware.spec import HardwareSpec
from opgraph.ir import (
    Activation,
    AtenCall,
    Attention,
    DType,
    EagerPass,
    Elementwise,
    Embedding,
    ExpertGemm,
    ExpertPart,
    ExpertsImpl,
    Gemm,
    Memory,
    MoeRouting,
    Norm,
    NormVariant,
    OpBase,
    OpgraphError,
    OpKind,
    Reduction,
    Rope,
    Softmax,
    TensorSpec,
    eager_parts,
    sdpa_math_passes,
)
from validators.configs import OpConfig, config_key
from validators.replay import DeviceLostError, Replayer, ReplayOptions
from validators.results import ReplayResult, ReplayStatus
from validators.timing import TimingConfig


class ProfileError(OpgraphError):
    """A profile sweep cannot start or go on (a parts file of another device, a bad option)."""


@dataclass(frozen=True)
class SweepPoint:
    """One synthetic config of the sweep."""

    op: OpBase
    """The op to replay."""
    series: str
    """The series it belongs to (one shape along a size axis); points are interleaved across series."""
    level: int = 0
    """Coarse-to-fine rank: level 0 points are measured first."""
    warm_inputs: tuple[int, ...] = ()
    """The op's inputs that are activations in a model (read back into L2 after each flush)."""
    tag: str = ""
    """``launch`` for the empty-ish kernels, ``writeback`` for :data:`WRITEBACK_MIB`'s points."""
    dirty_bytes: int = 0
    """Bytes left dirty in L2 before each timed call (``writeback`` points)."""

    @property
    def key(self) -> str:
        """The config key (tag and dirty MiB included: a launch or write-back point is kept apart from an
        equal op)."""
        dirty = f"{self.dirty_bytes >> 20}" if self.dirty_bytes else ""
        return config_key(self.op) + (f"-{self.tag}{dirty}" if self.tag else "")


# -- the sweep ------------------------------------------------------------------------------------------

M_SIZES = tuple(2**i for i in range(15))  # 1 .. 16384
"""GEMM rows: geometric from a one-token decode to a 16k-token prefill."""

DENSE_NK: tuple[tuple[str, int, int], ...] = (
    # Llama 3.1 8B (hidden 4096, 32 q / 8 kv heads of 128, MLP 14336, vocab 128256)
    ("llama8b.q_o", 4096, 4096),
    ("llama8b.kv", 1024, 4096),
    ("llama8b.gate_up", 14336, 4096),
    ("llama8b.down", 4096, 14336),
    ("llama8b.lm_head", 128256, 4096),
    # Llama 3.2 1B (hidden 2048, 32 q / 8 kv heads of 64, MLP 8192)
    ("llama1b.q_o", 2048, 2048),
    ("llama1b.kv", 512, 2048),
    ("llama1b.gate_up", 8192, 2048),
    ("llama1b.down", 2048, 8192),
    # Llama 3.1 70B (hidden 8192, 64 q / 8 kv heads, MLP 28672)
    ("llama70b.q_o", 8192, 8192),
    ("llama70b.kv", 1024, 8192),
    ("llama70b.gate_up", 28672, 8192),
    ("llama70b.down", 8192, 28672),
    # Qwen2.5 7B (hidden 3584, 28 q / 4 kv heads, MLP 18944)
    ("qwen25_7b.q_o", 3584, 3584),
    ("qwen25_7b.kv", 512, 3584),
    ("qwen25_7b.gate_up", 18944, 3584),
    ("qwen25_7b.down", 3584, 18944),
    # Qwen3-30B-A3B attention (hidden 2048, 32 q of 128) and its router
    ("qwen3moe.q", 4096, 2048),
    ("qwen3moe.o", 2048, 4096),
    ("qwen3moe.router", 128, 2048),
    ("mixtral.router", 8, 4096),
    ("llama1b.lm_head", 128256, 2048),
)
"""(name, n, k) of the linear layers of common model families."""

UNALIGNED_NK: tuple[tuple[str, int, int], ...] = (
    # GPT-2's and GPT-Neo's vocabulary of 50257 (medium's hidden 1024, XL's 1600), a vocabulary grown by one
    # token: rows of an odd number of elements, which cuBLAS runs on other kernels (GPT-2 medium's
    # lm_head at 4096 rows: 4.0 ms, 7x the aligned GEMM's time).
    ("gpt2.lm_head", 50257, 1024),
    ("gpt2xl.lm_head", 50257, 1600),
    ("vocab32001.lm_head", 32001, 4096),
)
"""(name, n, k) of dense linear layers whose rows are not 16-byte aligned
(``hardware.models.profile.unaligned_gemm``)."""

UNALIGNED_M = (1, 16, 256, 1024, 4096)
"""Rows of the unaligned GEMMs: their align-1 kernels are slow, so fewer than the aligned series' 15."""

ATTENTION_HEADS: tuple[tuple[str, int, int, int], ...] = (
    ("llama8b", 32, 8, 128),
    ("llama70b", 64, 8, 128),
    ("llama1b", 32, 8, 64),
    ("qwen25_7b", 28, 4, 128),
    ("qwen3moe", 32, 4, 128),
    ("mha", 32, 32, 128),
)
"""(name, heads, kv_heads, head_dim) of common attention layouts."""

MOE: tuple[tuple[str, int, int, int, int], ...] = (
    ("qwen3moe", 128, 8, 2048, 768),
    ("mixtral", 8, 2, 4096, 14336),
)
"""(name, experts, top_k, hidden, expert intermediate size) of MoE layers."""

LOOP_MOE: tuple[tuple[str, int, int, int, int], ...] = (
    *MOE,
    ("qwen3moe235b", 128, 8, 4096, 1536),
    ("gptoss", 32, 4, 2880, 2880),
    ("phi35moe", 16, 2, 4096, 6400),
)
"""The MoE layers whose expert products the loop series measure (``moe.*.loop``; Qwen3-235B-A22B, gpt-oss-20b
and Phi-3.5-MoE beside those of :data:`MOE`): each expert's weights of 3 to 235 MB spread over the range of
bytes the loop's efficiency curve is measured along (``hardware.models.profile``, the expert-loop regime)."""

LOOP_ROWS = (1, 8, 32, 128, 512, 2048)
"""Rows per expert of the loop series: one grid for every layer of :data:`LOOP_MOE`, so each row count is
measured over the whole range of bytes."""

TOKENS = (1, 8, 32, 128, 512, 2048, 8192, 16384)
"""Token counts of pointwise ops: decode batches to long prefills."""

PAIRS = (1, 2, 4, 8, 32, 128, 512, 2048)
"""Token-expert pairs of the ``batched_mm`` expert GEMMs: every pair count to 8, where a decode's few
small per-pair products run into latency (the grouped bmm points, of 8 or more products, priced them
up to 2.2x too fast there), then 4x steps, where the kernel streams the pairs' weight copies and its
time grows with them. 2048 pairs is a 256-token prefill of Qwen3-30B-A3B (top 8); ``batched_mm`` holds
a weight copy per pair, so a longer prefill is no regime it runs in (past the sweep the largest
point's efficiency holds, which a bandwidth-bound kernel keeps)."""
BATCHED_MM_COPY_BYTES = 16 << 30
"""Largest bytes of per-pair weight copies one ``batched_mm`` point gathers (16 GiB: room on an 80 GB
card beside the stacked weights and the L2 flush, and a few ms a run): Mixtral's gate_up, 235 MB a pair,
stops at 32 pairs (16 decode tokens), its down at 128."""


def coarse_to_fine(n: int) -> list[int]:
    """A level for each of ``n`` sorted sizes: the ends 0, the middle 1, the quarters 2...

    >>> coarse_to_fine(5)
    [0, 2, 1, 2, 0]
    """
    levels = [0] * n
    if n <= 2:
        return levels

    def split(lo: int, hi: int, depth: int) -> None:
        if hi - lo < 2:
            return
        mid = (lo + hi) // 2
        levels[mid] = depth
        split(lo, mid, depth + 1)
        split(mid, hi, depth + 1)

    split(0, n - 1, 1)
    return levels


def _series(name: str, ops: Iterable[OpBase], *, base: int = 0, warm: tuple[int, ...] = ()) -> list[SweepPoint]:
    items = list(ops)
    levels = coarse_to_fine(len(items))
    return [SweepPoint(op, name, base + lv, warm) for op, lv in zip(items, levels, strict=True)]


def _gemm(m: int, n: int, k: int, dtype: DType = DType.bf16, batch: int = 1) -> Gemm:
    if batch > 1:
        ins = (TensorSpec(shape=(batch, m, k), dtype=dtype), TensorSpec(shape=(batch, k, n), dtype=dtype))
        out = (TensorSpec(shape=(batch, m, n), dtype=dtype),)
    else:
        ins = (TensorSpec(shape=(m, k), dtype=dtype), TensorSpec(shape=(n, k), dtype=dtype))
        out = (TensorSpec(shape=(m, n), dtype=dtype),)
    return Gemm(id=0, m=m, n=n, k=k, batch=batch, dtype=dtype, inputs=ins, outputs=out, target="aten.mm.default")


def _eager_scores(q: int, kv: int, d: int, bh: int) -> Gemm:
    """Eager attention's scores ``q @ K^T`` per head as the model runs them: the keys ``[bh, kv, d]`` read
    through their transposed view."""
    op = _gemm(q, kv, d, batch=bh)
    keys = TensorSpec(shape=(bh, d, kv), dtype=op.dtype, strides=(kv * d, 1, d))
    return op.model_copy(update={"inputs": (op.inputs[0], keys)})


def _experts(name: str, part: str, tokens: int, experts: int, top_k: int, n: int, k: int, impl: str) -> Gemm:
    m = max(1, round(tokens * top_k / experts))
    dt = DType.bf16
    ins: tuple[TensorSpec, ...]
    out: tuple[TensorSpec, ...]
    if impl == "grouped_mm":
        # As capture records transformers' default experts (``_grouped_mm``): the routed token-expert
        # pairs [T*top_k, k] against the stacked weights [E, k, n] (a transposed view), with offsets.
        rows = tokens * top_k
        ins = (
            TensorSpec(shape=(rows, k), dtype=dt),
            TensorSpec(shape=(experts, k, n), dtype=dt, strides=(n * k, 1, k)),
            TensorSpec(shape=(experts,), dtype=DType.int32),
        )
        out = (TensorSpec(shape=(rows, n), dtype=dt),)
        h = k if part == "gate_up" else n
        definition = f"moe_grouped_mm_e{experts}_h{h}_topk{top_k}_{part}_t{tokens}"
        target = f"moe_experts_{part}"
        call = AtenCall(args=({"tensor": 0}, {"tensor": 1}, {"tensor": 2}))
        return Gemm(
            id=0, m=m, n=n, k=k, groups=experts, dtype=dt, inputs=ins, outputs=out, target=target,
            definition=definition, call=call, expert=_expert(impl, experts, top_k, part),
        )  # fmt: skip
    if impl == "bmm":
        # As capture records transformers' batched experts: [E, m, k] @ [E, k, n] (a transposed weight view).
        ins = (
            TensorSpec(shape=(experts, m, k), dtype=dt),
            TensorSpec(shape=(experts, k, n), dtype=dt, strides=(n * k, 1, k)),
        )
        out = (TensorSpec(shape=(experts, m, n), dtype=dt),)
        definition = f"moe_bmm_e{experts}_h{k if part == 'gate_up' else n}_topk{top_k}_{part}"
        target = f"moe_experts_{part}"
    else:
        ins, out = (), ()
        definition = f"moe_loop_e{experts}_n{n}_k{k}_topk{top_k}_{part}"
        target = f"{name}_experts_{part}"
    return Gemm(
        id=0, m=m, n=n, k=k, groups=experts, dtype=dt, inputs=ins, outputs=out, target=target, definition=definition,
        expert=_expert(impl, experts, top_k, part),
    )  # fmt: skip


def _expert(impl: str, experts: int, top_k: int, part: str) -> ExpertGemm:
    return ExpertGemm(impl=ExpertsImpl.named(impl), experts=experts, top_k=top_k, part=ExpertPart(part))


def batched_mm_gemm(part: str, pairs: int, experts: int, top_k: int, hidden: int, inter: int) -> Gemm:
    """An expert GEMM of transformers' ``batched_mm`` experts as capture records it: ``pairs``
    token-expert pairs, each its expert's gathered ``[n, k]`` weight copy @ its token ``[k, 1]`` (the
    weight-first layout), one ``torch.bmm`` of them all (``batch`` = pairs, ``m`` = 1)."""
    n, k = (2 * inter, hidden) if part == "gate_up" else (hidden, inter)
    dt = DType.bf16
    ins = (TensorSpec(shape=(pairs, n, k), dtype=dt), TensorSpec(shape=(pairs, k, 1), dtype=dt))
    return Gemm(
        id=0, m=1, n=n, k=k, batch=pairs, dtype=dt, inputs=ins, outputs=(TensorSpec(shape=(pairs, n, 1), dtype=dt),),
        target=f"moe_experts_{part}", definition=f"moe_batched_mm_e{experts}_h{hidden}_i{inter}_topk{top_k}_{part}",
        call=AtenCall(args=({"tensor": 0}, {"tensor": 1})), expert=_expert("batched_mm", experts, top_k, part),
    )  # fmt: skip


def _batched_mm_series(
    name: str, experts: int, top_k: int, hidden: int, inter: int, pairs: Iterable[int], *, base: int
) -> list[SweepPoint]:
    """The ``batched_mm`` series of an MoE layer's two expert GEMMs over ``pairs`` (those whose weight
    copies fit :data:`BATCHED_MM_COPY_BYTES`), the pairs' tokens warm (activations)."""
    pts: list[SweepPoint] = []
    for part in ("gate_up", "down"):
        ops = [batched_mm_gemm(part, p, experts, top_k, hidden, inter) for p in pairs]
        fits = [op for op in ops if op.inputs[0].nbytes <= BATCHED_MM_COPY_BYTES]
        pts += _series(f"moe.{name}.{part}.batched_mm", fits, base=base, warm=(1,))
    return pts


def _attention(
    b: int, q: int, kv: int, heads: tuple[int, int, int], *, causal: bool, window: int | None, dt: DType = DType.bf16
) -> Attention:
    h, kvh, d = heads
    ins = (
        TensorSpec(shape=(b, h, q, d), dtype=dt, strides=(q * h * d, d, h * d, 1)),
        TensorSpec(shape=(b, kvh, kv, d), dtype=dt),
        TensorSpec(shape=(b, kvh, kv, d), dtype=dt),
    )
    out = (TensorSpec(shape=(b, h, q, d), dtype=dt),)
    return Attention(
        id=0, batch=b, q_len=q, kv_len=kv, heads=h, kv_heads=kvh, head_dim=d, causal=causal, window=window,
        dtype=dt, inputs=ins, outputs=out, target="aten.scaled_dot_product_attention",
    )  # fmt: skip


def _float_tables_rope(tokens: int, heads: int = 32, head_dim: int = 128) -> Rope:
    """A rotary embedding as OLMo 2 records it: bfloat16 queries (a transposed view of the projection) under
    float32 cos/sin tables, the output cast back to bfloat16."""
    q = TensorSpec(shape=(1, heads, tokens, head_dim), dtype=DType.bf16,
                   strides=(tokens * heads * head_dim, head_dim, heads * head_dim, 1))  # fmt: skip
    table = TensorSpec(shape=(1, 1, tokens, head_dim), dtype=DType.fp32)
    out = TensorSpec(shape=(1, heads, tokens, head_dim), dtype=DType.bf16)
    return Rope(id=0, tokens=tokens, heads=heads, head_dim=head_dim, inputs=(q, table, table), outputs=(out,))


def _chunked_swiglu(tokens: int, inter: int) -> Activation:
    """``silu(gate) * up`` as an MoE experts block runs it: ``gate, up = gate_up.chunk(2, -1)``, so
    each operand is a strided view (rows ``2 * inter`` apart) of one ``[tokens, 2 * inter]`` tensor."""
    half = TensorSpec(shape=(tokens, inter), dtype=DType.bf16, strides=(2 * inter, 1))
    return Activation(
        id=0, fn="swiglu", numel=tokens * inter, hidden=inter, gated=True, inputs=(half,),
        outputs=(TensorSpec(shape=(tokens, inter), dtype=DType.bf16),),
    )  # fmt: skip


def _strided_kv_write(batch: int, seq: int, kv_heads: int = 8, head_dim: int = 128) -> Memory:
    """A prefill's KV-cache write as transformers' ``DynamicCache`` runs it: ``torch.cat`` of the
    empty cache and the new ``[b, kv_heads, seq, d]`` keys, a transposed view of ``[b, seq, kv_heads, d]``."""
    shape = (batch, kv_heads, seq, head_dim)
    new = TensorSpec(
        shape=shape, dtype=DType.bf16, strides=(seq * kv_heads * head_dim, head_dim, kv_heads * head_dim, 1)
    )
    return Memory(
        id=0, fn="kv_cache_write", numel=batch * kv_heads * seq * head_dim,
        inputs=(TensorSpec(shape=(batch, kv_heads, 0, head_dim), dtype=DType.bf16), new),
        outputs=(TensorSpec(shape=shape, dtype=DType.bf16),),
    )  # fmt: skip


def _transposed_copy(batch: int, seq: int, heads: int = 32, head_dim: int = 128) -> Memory:
    """``x.transpose(1, 2).contiguous()`` of a ``[b, seq, heads, d]`` tensor (eager attention's output)."""
    shape = (batch, heads, seq, head_dim)
    src = TensorSpec(shape=shape, dtype=DType.bf16, strides=(seq * heads * head_dim, head_dim, heads * head_dim, 1))
    return Memory(
        id=0, fn="copy", numel=math.prod(shape), inputs=(src,), outputs=(TensorSpec(shape=shape, dtype=DType.bf16),),
        target="aten.clone.default",
    )  # fmt: skip


def _mla_key_copy(part: str, batch: int, seq: int, heads: int = 128, nope: int = 128, rope: int = 64) -> Memory:
    """A ``copy_`` into a slice of DeepSeek-V3's MLA keys ``[b, heads, seq, nope + rope]`` (transformers'
    ``expand_kv``): the ``nope`` part out of the key/value projection viewed ``[b, heads, seq, nope]``
    (a transposed slice of ``[b, seq, heads, nope + v]``, ``v = nope``), or the ``rope`` part, one head
    broadcast over all (stride 0)."""
    width = nope + rope
    d = nope if part == "nope" else rope
    shape = (batch, heads, seq, d)
    dst = TensorSpec(shape=shape, dtype=DType.bf16, strides=(heads * seq * width, seq * width, width, 1))
    if part == "nope":
        src_strides = (seq * heads * 2 * nope, 2 * nope, heads * 2 * nope, 1)
    else:
        src_strides = (seq * rope, 0, rope, 1)
    src = TensorSpec(shape=shape, dtype=DType.bf16, strides=src_strides)
    return Memory(
        id=0, fn="copy", numel=math.prod(shape), inputs=(dst, src),
        outputs=(TensorSpec(shape=shape, dtype=DType.bf16),), target="aten.copy_.default",
    )  # fmt: skip


def _sinks_cat(rows: int, keys: int) -> Memory:
    """gpt-oss's ``torch.cat([scores, sinks], dim=-1)``: each row of scores gains its head's sink column, so
    the rows written are ``keys + 1`` long."""
    dt = DType.bf16
    return Memory(
        id=0, fn="cat", numel=rows * (keys + 1),
        inputs=(TensorSpec(shape=(rows, keys), dtype=dt), TensorSpec(shape=(rows, 1), dtype=dt)),
        outputs=(TensorSpec(shape=(rows, keys + 1), dtype=dt),),
    )  # fmt: skip


def _broadcast_pass(fn: str, heads: int, q: int, cols: int) -> OpBase:
    """A pass of eager attention over its scores ``[1, heads, q, cols]`` that reads an operand broadcast over
    them, laid out as the model's (``opgraph.ir.eager_parts``): the mask over the heads (``add``), the row
    maximum over the row (``sub``), the sink column expanded over the queries (``cat``: ``cols - 1`` keys)."""
    dt = DType.bf16
    att = Attention(id=0, batch=1, q_len=q, kv_len=cols - (fn != "add"), heads=heads, kv_heads=heads, head_dim=64)
    size = dt.itemsize
    if fn == "cat":
        p = EagerPass(kind=OpKind.MEMORY, fn="cat", read=size, written=size, read_row=size, written_row=size,
                      extra_cols=1, broadcast=True)  # fmt: skip
    elif fn == "sub":
        p = EagerPass(kind=OpKind.ELEMENTWISE, fn="sub", read=size, written=size, read_row=2 * size,
                      written_row=size, extra_cols=1, broadcast=True)  # fmt: skip
    else:
        p = EagerPass(kind=OpKind.ELEMENTWISE, fn="add", read=size * (1 + 1 / heads), written=size, broadcast=True)
    return eager_parts(att.model_copy(update={"eager": (p,)}))[1]


def _half_to_float(rows: int, cols: int, *, masked: bool = False) -> Softmax:
    """``softmax(x, dtype=torch.float32)`` of half ``x`` ``[rows, cols]``, as ``opgraph.ir.eager_parts`` gives
    an fp16 model's eager softmax."""
    ins = (TensorSpec(shape=(rows, cols), dtype=DType.fp16),)
    outs = (TensorSpec(shape=(rows, cols), dtype=DType.fp32),)
    return Softmax(id=0, rows=rows, cols=cols, dtype=DType.fp32, masked=masked, inputs=ins, outputs=outs)


def _alibi_scores(heads: int, q: int, part: int) -> OpBase:
    """BLOOM's ``baddbmm(alibi, q, k^T)`` over the scores ``[1, heads, q, q]`` (``opgraph.ir.EagerPass.addend``):
    part 0 the copy of the ``[heads, 1, q]`` alibi expanded over the queries, part 1 the GEMM that accumulates
    onto it."""
    att = Attention(id=0, batch=1, q_len=q, kv_len=q, heads=heads, kv_heads=heads, head_dim=64)
    size = DType.bf16.itemsize
    p = EagerPass(kind=OpKind.MEMORY, fn="addend", read=size / q, written=size, broadcast=True, addend=True)
    return eager_parts(att.model_copy(update={"eager": (p,)}))[part]


def _repeat_kv(batch: int, seq: int, kv_heads: int = 8, group: int = 4, head_dim: int = 128) -> Memory:
    """transformers' ``repeat_kv``: the ``[b, kv_heads, seq, d]`` keys or values expanded to every query
    head (the group's stride 0) and copied, as eager attention (and SDPA given a mask on GQA) runs it."""
    shape = (batch, kv_heads, group, seq, head_dim)
    strides = (kv_heads * seq * head_dim, seq * head_dim, 0, head_dim, 1)
    return Memory(
        id=0, fn="repeat_kv", numel=math.prod(shape),
        inputs=(TensorSpec(shape=shape, dtype=DType.bf16, strides=strides),),
        outputs=(TensorSpec(shape=shape, dtype=DType.bf16),),
    )  # fmt: skip


def _fp32_weights_combine(tokens: int, experts: int, top_k: int, hidden: int) -> MoeRouting:
    """An MoE combine as capture records Mixtral's: expert rows, float32 routing weights, the sort
    order and the token index of each pair."""
    pairs = tokens * top_k
    ins = (
        TensorSpec(shape=(pairs, hidden), dtype=DType.bf16),
        TensorSpec(shape=(pairs, 1), dtype=DType.fp32),
        TensorSpec(shape=(pairs,), dtype=DType.int64),
        TensorSpec(shape=(pairs,), dtype=DType.int64),
    )
    return MoeRouting(
        id=0, fn="combine", tokens=tokens, experts=experts, top_k=top_k, hidden=hidden, inputs=ins,
        definition=f"moe_combine_e{experts}_topk{top_k}_weights_fp32",
    )  # fmt: skip


def _gpu_sweep() -> list[SweepPoint]:
    pts: list[SweepPoint] = []
    ops: Iterable[OpBase]
    # Launch floor and host time per aten call: the smallest kernels there are.
    pts.append(SweepPoint(Elementwise(id=0, fn="add", numel=1, hidden=1), "launch", 0, (), "launch"))
    pts.append(SweepPoint(Memory(id=0, fn="zero", numel=1), "launch", 0, (), "launch"))
    # GEMMs: bf16 over every family's (n, k); fp16 and fp32 on a few.
    for i, (name, n, k) in enumerate(DENSE_NK):
        base = 0 if i < 13 else 1
        pts += _series(f"gemm.{name}", (_gemm(m, n, k) for m in M_SIZES), base=base, warm=(0,))
    for name, n, k in (("llama8b.q_o", 4096, 4096), ("llama8b.gate_up", 14336, 4096), ("llama1b.down", 2048, 8192)):
        pts += _series(f"gemm.fp16.{name}", (_gemm(m, n, k, DType.fp16) for m in M_SIZES[::2]), base=2, warm=(0,))
    for name, n, k in (("llama8b.q_o", 4096, 4096), ("llama1b.gate_up", 8192, 2048)):
        pts += _series(f"gemm.fp32.{name}", (_gemm(m, n, k, DType.fp32) for m in (1, 16, 256, 4096)), base=3, warm=(0,))
    for name, n, k in UNALIGNED_NK:
        for dt in (DType.bf16, DType.fp16):
            ops = (_gemm(m, n, k, dt) for m in UNALIGNED_M)
            pts += _series(f"gemm.unaligned.{dt.value}.{name}", ops, base=2, warm=(0,))
    # RoPE's inverse-frequency product: a batched [64 x 1] @ [1 x seq].
    for b in (1, 8, 32):
        pts += _series(f"gemm.rope_freq.b{b}", (_gemm(64, s, 1, batch=b) for s in (1, 16, 256, 2048, 16384)), base=2)
    # Eager attention's two batched matmuls per head (opgraph.ir.eager_parts): the scores [q x d] @ [d x kv]
    # and the weighted values [q x kv] @ [kv x d], for a decode's one query and a prefill's many, over
    # the key count; up to 2 GiB of scores a point.
    for d in (64, 128):
        for bh in (16, 64, 512):
            for kv in (512, 2048, 8192):
                qs = [q for q in (1, 256, 2048) if bh * q * kv * 2 <= 2 << 30]
                ops = (_gemm(q, kv, d, batch=bh) for q in qs)
                pts += _series(f"gemm.eager_scores.d{d}.bh{bh}.kv{kv}", ops, base=2, warm=(0,))
                ops = (_gemm(q, d, kv, batch=bh) for q in qs)
                pts += _series(f"gemm.eager_values.d{d}.bh{bh}.kv{kv}", ops, base=2, warm=(0,))
    # The same over a decode's cache of kv + 1 keys: rows of kv + 1 elements are not 16-byte aligned, and
    # cuBLAS runs other kernels on them (hardware.models.profile.unaligned_gemm). The scores read the keys
    # through their transposed view, as the model does (the aligned series above, measured first, read
    # contiguous operands: on aligned rows the eager prefill's attention came out right from them).
    for d in (64, 128):
        for bh in (16, 64, 512):
            for kv in (513, 2049, 8193):
                qs = [q for q in (1, 256) if bh * q * kv * 2 <= 2 << 30]
                ops = (_eager_scores(q, kv, d, bh) for q in qs)
                pts += _series(f"gemm.eager_scores.d{d}.bh{bh}.kv{kv}", ops, base=2, warm=(0,))
                ops = (_gemm(q, d, kv, batch=bh) for q in qs)
                pts += _series(f"gemm.eager_values.d{d}.bh{bh}.kv{kv}", ops, base=2, warm=(0,))
    # MoE: the eager loop's expert products (torch's fallback of ``_grouped_mm`` too), one row grid over
    # every layer's expert shapes; then routing, dispatch, batched and grouped expert GEMMs, combine.
    for name, e, top, hidden, inter in LOOP_MOE:
        for part, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
            ops = (_experts(name, part, rows * e // top, e, top, n, k, "loop") for rows in LOOP_ROWS)
            pts += _series(f"moe.{name}.{part}.loop", ops, base=2)
    for name, e, top, hidden, inter in MOE:
        toks = TOKENS
        for part, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
            pts += _series(
                f"moe.{name}.{part}", (_experts(name, part, t, e, top, n, k, "bmm") for t in toks), base=0, warm=(0,)
            )
            pts += _series(
                f"moe.{name}.{part}.grouped",
                (_experts(name, part, t, e, top, n, k, "grouped_mm") for t in toks),
                base=0,
                warm=(0,),
            )
        # transformers' opt-in batched_mm experts: one bmm of per-pair weight copies, over the pairs.
        pts += _batched_mm_series(name, e, top, hidden, inter, PAIRS, base=2)
        for fn in ("route", "dispatch", "combine"):
            ops = (
                MoeRouting(
                    id=0, fn=fn, tokens=t, experts=e, top_k=top, hidden=hidden, definition=f"moe_{fn}_e{e}_topk{top}"
                )
                for t in toks
            )
            pts += _series(f"moe.{name}.{fn}", ops, base=1)
        # Mixtral's router keeps the routing weights in float32, so its combine weighs, gathers and sums
        # in float32 (MoeRouting.weights_dtype): the inputs capture records for it, a kernel mix of its own.
        ops = (_fp32_weights_combine(t, e, top, hidden) for t in toks)
        pts += _series(f"moe.{name}.combine.weights_fp32", ops, base=2)
    # Attention: decode over the KV length, prefill over the sequence.
    for i, (name, h, kvh, d) in enumerate(ATTENTION_HEADS):
        heads = (h, kvh, d)
        for b in (1, 8, 32) if i < 2 else (8,):
            ops = (_attention(b, 1, kv, heads, causal=False, window=None) for kv in (128, 512, 2048, 8192, 32768))
            pts += _series(f"attn.decode.{name}.b{b}", ops, base=0 if i < 4 else 1, warm=(0,))
        for b in (1, 4) if i < 4 else (1,):
            ops = (_attention(b, s, s, heads, causal=True, window=None) for s in (128, 512, 2048, 8192, 16384))
            pts += _series(f"attn.prefill.{name}.b{b}", ops, base=0 if i < 4 else 1, warm=(0, 1, 2))
    # fp16 decodes, for the Llama-8B and 70B layouts and Llama-1B's head of 64: the held-out fp16 decodes ran ~12%
    # over the bf16 points in their traces; these run within 1% of them (the same kernels: the gap is elsewhere,
    # benchmarks/results/gpu/h100/in-model-probes/), and price an fp16 decode from its own dtype.
    for name, h, kvh, d in ATTENTION_HEADS[:3]:
        for b in (1, 8, 32) if d == 128 else (8,):
            ops = (
                _attention(b, 1, kv, (h, kvh, d), causal=False, window=None, dt=DType.fp16)
                for kv in (128, 512, 2048, 8192, 32768)
            )
            pts += _series(f"attn.decode.fp16.{name}.b{b}", ops, base=2, warm=(0,))
    # One-token decodes past a sliding window (Mistral, Phi-3, StarCoder2, Gemma's local layers): transformers
    # passes a mask, and SDPA runs a kernel that takes one (cuDNN's prefill kernel on the H100, over every
    # key: StarCoder2-3B b4 past 4096 keys 81 us a layer, against 13 without a mask).
    for name, h, kvh, d in (ATTENTION_HEADS[0], ATTENTION_HEADS[2], ATTENTION_HEADS[5]):
        for b in (1, 8, 32):
            ops = (_attention(b, 1, kv, (h, kvh, d), causal=False, window=kv // 2) for kv in (512, 2048, 8192, 32768))
            pts += _series(f"attn.decode.masked.{name}.b{b}", ops, base=2, warm=(0,))
    # SDPA's math path (Falcon's 71 query heads over one key head: no fused kernel takes it), kernel by kernel
    # as opgraph.ir.eager_parts lists them: float32 matmuls over a shared or copied key head, the mask add, the
    # safe softmax's isneginf, row-wise all and where, the casts and copies.
    math_shapes = ((1, 512, 512), (1, 2048, 2048), (2, 1024, 1024), (1, 1, 1025), (8, 1, 2049), (16, 1, 513))
    for b, q, kv in math_shapes:
        math = Attention(id=0, batch=b, q_len=q, kv_len=kv, heads=71, kv_heads=1, head_dim=64, causal=q > 1,
                         math=True, eager=sdpa_math_passes(mask_bytes=1, heads=71, half=True))  # fmt: skip
        # its softmax is the one eager attention runs, measured over the column counts above (a lone size of a
        # column count would hold its time under it: hardware.models.profile._Group.at)
        parts = [p for p in eager_parts(math) if not isinstance(p, Softmax)]
        pts += _series(f"attn.math.b{b}.q{q}.kv{kv}", parts, base=2, warm=(0,))
    llama = (32, 8, 128)
    pts += _series(
        "attn.window4096", (_attention(1, s, s, llama, causal=True, window=4096) for s in (2048, 8192, 16384)), base=1,
        warm=(0, 1, 2),
    )  # fmt: skip
    pts += _series(
        "attn.chunked", (_attention(1, q, 4 * q, llama, causal=True, window=None) for q in (128, 512, 2048)), base=2,
        warm=(0,),
    )  # fmt: skip
    pts += _series(
        "attn.full", (_attention(1, s, s, llama, causal=False, window=None) for s in (512, 2048, 8192)), base=2,
        warm=(0, 1, 2),
    )  # fmt: skip
    # Memory-bound kinds by size.
    for hidden in (2048, 4096, 8192):
        pts += _series(f"norm.rms.h{hidden}", (Norm(id=0, rows=t, hidden=hidden) for t in TOKENS), base=0)
    pts += _series(
        "norm.layer.h4096", (Norm(id=0, rows=t, hidden=4096, variant=NormVariant.LAYER) for t in TOKENS[::2]), base=2
    )
    for h, d in ((32, 128), (8, 128), (32, 64)):
        pts += _series(
            f"rope.h{h}.d{d}", (Rope(id=0, tokens=t, heads=h, head_dim=d) for t in TOKENS), base=0 if h == 32 else 1
        )
    # float32 cos/sin under bfloat16 queries (OLMo 2): the rotation runs in float32, then the cast back
    pts += _series("rope.float_tables.h32.d128", (_float_tables_rope(t) for t in TOKENS), base=2)
    for inter in (8192, 14336, 28672):
        ops = (Activation(id=0, fn="swiglu", numel=t * inter, hidden=inter, gated=True) for t in TOKENS)
        pts += _series(f"act.swiglu.{inter}", ops, base=0 if inter == 14336 else 1)
    pts += _series(
        "act.silu", (Activation(id=0, fn="silu", numel=t * 14336, hidden=14336) for t in TOKENS[::2]), base=2
    )
    for fn in ("tanh", "gelu", "gelu_tanh"):  # ungated activations other than SiLU (BLOOM's GELU has a tanh)
        ops = (Activation(id=0, fn=fn, numel=t * 4096, hidden=4096) for t in TOKENS[::2])
        pts += _series(f"act.{fn}", ops, base=2)
    for inter in (768, 14336):  # An MoE expert's gate and up: the two halves of one chunked projection.
        pts += _series(f"act.swiglu.chunked.{inter}", (_chunked_swiglu(t, inter) for t in TOKENS[1:]), base=1)
    for fn in ("add", "mul"):
        ops = (Elementwise(id=0, fn=fn, numel=t * 4096, hidden=4096) for t in TOKENS)
        pts += _series(f"ew.{fn}", ops, base=0)
        # eager attention's passes over its scores: up to 256 Mi elements
        ops = (Elementwise(id=0, fn=fn, numel=n, hidden=2048) for n in (2**27, 2**28))
        pts += _series(f"ew.scores.{fn}", ops, base=2)
    pts += _series("ew.sub", (Elementwise(id=0, fn="sub", numel=t * 4096, hidden=4096) for t in TOKENS), base=2)
    # By a Python number (opgraph.ir.Elementwise.scalar: one tensor read, another kernel), up to the size of
    # eager attention's scores (``scores * scaling``); in float32 as RoPE's tables (``cos * attention_scaling``).
    for fn in ("mul", "add"):
        ops = (Elementwise(id=0, fn=fn, numel=t * 4096, hidden=4096, scalar=True) for t in TOKENS[::2])
        pts += _series(f"ew.scalar.{fn}", ops, base=2)
    ops = (Elementwise(id=0, fn="mul", numel=n, hidden=2048, scalar=True) for n in (2**27, 2**28))
    pts += _series("ew.scores.scalar.mul", ops, base=2)
    ops = (Elementwise(id=0, fn="mul", numel=t * 128, hidden=128, dtype=DType.fp32, scalar=True) for t in TOKENS[::2])
    pts += _series("ew.fp32.scalar.mul", ops, base=2)
    for fn in ("cos", "sin", "rsqrt"):
        pts += _series(f"ew.{fn}", (Elementwise(id=0, fn=fn, numel=t * 128, hidden=128) for t in TOKENS[::2]), base=2)
    # RoPE's tables as transformers builds them: in float32.
    f32 = DType.fp32
    for fn in ("cos", "sin", "mul", "add"):
        ops = (Elementwise(id=0, fn=fn, numel=t * 128, hidden=128, dtype=f32) for t in TOKENS[::2])
        pts += _series(f"ew.fp32.{fn}", ops, base=1 if fn in ("cos", "mul") else 2)
    fill = (Memory(id=0, fn="fill", numel=n, dtype=f32) for n in (1, 128, 2048, 16384))
    pts += _series("mem.fill.fp32", fill, base=2)
    cat32 = (
        Memory(
            id=0, fn="cat", numel=t * 128, dtype=f32,
            inputs=(TensorSpec(shape=(t, 64), dtype=f32), TensorSpec(shape=(t, 64), dtype=f32)),
            outputs=(TensorSpec(shape=(t, 128), dtype=f32),),
        )
        for t in TOKENS[::2]
    )  # fmt: skip
    pts += _series("mem.cat.fp32", cat32, base=2)
    cast32 = (
        Memory(
            id=0, fn="cast", numel=t * 128, dtype=f32, inputs=(TensorSpec(shape=(t, 128), dtype=f32),),
            outputs=(TensorSpec(shape=(t, 128), dtype=DType.bf16),),
        )
        for t in TOKENS[::2]
    )  # fmt: skip
    pts += _series("mem.cast.fp32", cast32, base=2)
    for cols in (128, 4096):
        pts += _series(f"softmax.c{cols}", (Softmax(id=0, rows=t, cols=cols) for t in TOKENS), base=1)
    # Eager attention's softmax over its scores: a row per query and head, a column per key; transformers
    # takes it in float32, gpt-oss (with its sinks) in bf16.
    for cols in (512, 2048, 8192):
        rows = (2**20 // cols, 2**24 // cols, 2**27 // cols)
        pts += _series(f"softmax.fp32.c{cols}", (Softmax(id=0, rows=r, cols=cols, dtype=f32) for r in rows), base=2)
    pts += _series("softmax.c2048", (Softmax(id=0, rows=r, cols=2048) for r in (2**9, 2**13, 2**16)), base=2)
    # Half scores taken in float32 (an fp16 model's eager attention): one kernel that reads them, past 1024
    # columns a block per row (hardware.models.profile.half_input_softmax).
    for cols in (512, 1024, 2048, 4096, 8192):
        ops = (_half_to_float(n // cols, cols) for n in (2**20, 2**24, 2**27, 2**28))
        pts += _series(f"softmax.half_to_float.c{cols}", ops, base=2)
    # Both over a causal prefill's scores (opgraph.ir.Softmax.masked: the kernels run longer on them).
    for cols in (512, 1024, 2048, 4096, 8192):
        ops = (_half_to_float(n // cols, cols, masked=True) for n in (2**24, 2**27, 2**28))
        pts += _series(f"softmax.half_to_float.masked.c{cols}", ops, base=2)
    for cols in (512, 2048, 8192):
        ops = (Softmax(id=0, rows=n // cols, cols=cols, dtype=f32, masked=True) for n in (2**24, 2**27, 2**28))
        pts += _series(f"softmax.fp32.masked.c{cols}", ops, base=2)
    # The same over rows that are not 16-byte aligned (hardware.models.profile.unaligned_rows): a decode's kv + 1
    # keys, gpt-oss's sinks column (2049 columns from the sinks cat on), with the row maximum it subtracts.
    for cols in (513, 2049, 8193):
        rows = (2**20 // cols, 2**24 // cols, 2**27 // cols)
        pts += _series(f"softmax.fp32.c{cols}", (Softmax(id=0, rows=r, cols=cols, dtype=f32) for r in rows), base=2)
    pts += _series("softmax.c2049", (Softmax(id=0, rows=r, cols=2049) for r in (2**9, 2**13, 2**16, 2**17)), base=2)
    for cols in (2048, 2049):
        ops = (Reduction(id=0, fn="max", numel_in=r * cols, numel_out=r, reduced=cols) for r in (2**9, 2**13, 2**17))
        pts += _series(f"red.max.c{cols}", ops, base=2)
    pts += _series("mem.cat.sinks", (_sinks_cat(r, 2048) for r in (2**9, 2**13, 2**17)), base=2)
    # What eager attention reads broadcast over its scores (opgraph.ir.EagerPass.broadcast): a mask over the
    # heads, a row maximum over its row, gpt-oss's sinks expanded over the queries (a strided kernel each).
    pts += _series("ew.broadcast.add", (_broadcast_pass("add", 32, q, 2048) for q in (64, 512, 2048)), base=2)
    pts += _series("ew.broadcast.sub", (_broadcast_pass("sub", 64, q, 2049) for q in (8, 128, 2048)), base=2)
    pts += _series("mem.cat.sinks_expanded", (_broadcast_pass("cat", 64, q, 2049) for q in (8, 128, 2048)), base=2)
    pts += _series("mem.addend", (_alibi_scores(16, n, 0) for n in (128, 512, 2048, 4096)), base=2)
    for nh, lengths in ((16, (512, 2048, 4096)), (64, (512, 1024, 2048))):
        pts += _series(f"gemm.baddbmm.h{nh}", (_alibi_scores(nh, n, 1) for n in lengths), base=2)
    pts += _series("mem.repeat_kv", (_repeat_kv(b, s) for b in (1, 8) for s in (512, 2048, 8192)), base=1)
    sizes = [4**i for i in range(5, 15)]  # 1 Ki .. 256 Mi elements
    for fn in ("copy", "cast"):
        ops = (
            Memory(
                id=0, fn=fn, numel=s, inputs=(TensorSpec(shape=(s,), dtype=DType.bf16),),
                outputs=(TensorSpec(shape=(s,), dtype=DType.bf16 if fn == "copy" else DType.fp32),),
            )
            for s in sizes
        )  # fmt: skip
        pts += _series(f"mem.{fn}", ops, base=0 if fn == "copy" else 1)
    # A cast back from float32 (eager attention's probabilities to bfloat16): another kernel per byte than the
    # widening one above (a graph's cast carries the dtype it reads, as these do).
    ops = (
        Memory(
            id=0, fn="cast", numel=s, dtype=DType.fp32, inputs=(TensorSpec(shape=(s,), dtype=DType.fp32),),
            outputs=(TensorSpec(shape=(s,), dtype=DType.bf16),),
        )
        for s in sizes
    )  # fmt: skip
    pts += _series("mem.cast.narrow", ops, base=2)
    cat_ops = (
        Memory(
            id=0, fn="cat", numel=2 * t * 64,
            inputs=(TensorSpec(shape=(t, 32, 64), dtype=DType.bf16), TensorSpec(shape=(t, 32, 64), dtype=DType.bf16)),
            outputs=(TensorSpec(shape=(t, 32, 128), dtype=DType.bf16),),
        )
        for t in TOKENS
    )  # fmt: skip
    pts += _series("mem.cat", cat_ops, base=1)
    for b in (1, 8, 32):
        ops = (
            Memory(
                id=0, fn="kv_cache_write", numel=b * 8 * (n + 1) * 128,
                inputs=(
                    TensorSpec(shape=(b, 8, n, 128), dtype=DType.bf16),
                    TensorSpec(shape=(b, 8, 1, 128), dtype=DType.bf16),
                ),
                outputs=(TensorSpec(shape=(b, 8, n + 1, 128), dtype=DType.bf16),),
            )
            for n in (128, 1024, 4096, 16384)
        )  # fmt: skip
        pts += _series(f"mem.kv_write.b{b}", ops, base=0 if b == 8 else 1, warm=(1,))
    # A prefill's KV-cache write: the new keys or values as a transposed view of the projection.
    pts += _series("mem.kv_write.strided", (_strided_kv_write(1, s) for s in (16, 128, 512, 2048, 8192, 16384)), base=1)
    # Copies that read or write through a strided view: a transposed tensor made contiguous, and the two
    # copies DeepSeek-V3's MLA assembles its keys with (each head's no-rope part out of the transposed
    # key/value projection, then the shared rope part broadcast over the heads, into slices of one tensor).
    ops = (_transposed_copy(b, s) for b, s in ((1, 256), (1, 2048), (4, 4096), (8, 8192)))
    pts += _series("mem.copy.transposed", ops, base=1)
    for part in ("nope", "rope"):
        ops = (_mla_key_copy(part, b, s) for b, s in ((1, 64), (1, 512), (1, 4096), (8, 2048)))
        pts += _series(f"mem.copy.mla_{part}", ops, base=1)
    for hidden, vocab in ((4096, 128256), (2048, 128256), (3584, 152064)):
        ops = (Embedding(id=0, tokens=t, vocab=vocab, hidden=hidden) for t in TOKENS)
        pts += _series(f"embedding.h{hidden}", ops, base=0 if hidden == 4096 else 1)
    return pts + _writeback_sweep()


WRITEBACK_MIB = (0, 4, 8, 16, 32, WRITEBACK_MAX_BYTES >> 20)
"""Dirty L2 (MiB) the ``writeback`` points are measured after: a write of that many bytes after the
flush, as the op before leaves its output in L2 (the flush itself reads, so a point at 0 pays no
write-back). What an op pays for its predecessor's write-back grows with the dirty bytes and stops
growing between 32 and 64 MiB on an H100 and an H200 (``benchmarks/results/gpu/h100/in-model-probes``);
it is a kernel's own, so each op kind is measured (:func:`writeback_ops`)."""


def writeback_ops() -> list[tuple[str, OpBase]]:
    """``(name, op)`` of the ``writeback`` series: one op of each kind a model runs after a writer, each
    moving more bytes than the most :data:`WRITEBACK_MIB` leaves dirty (so that it meets all of them),
    memory-bound and compute-bound ones apart (a GEMM or attention of each)."""
    llama8b = (32, 8, 128)
    return [
        ("ew.add", Elementwise(id=0, fn="add", numel=16 << 20, hidden=4096)),
        ("norm.rms", Norm(id=0, rows=8192, hidden=4096)),
        ("rope", Rope(id=0, tokens=8192, heads=32, head_dim=128)),
        ("act.swiglu", Activation(id=0, fn="swiglu", numel=2048 * 14336, hidden=14336, gated=True)),
        ("mem.copy.transposed", _transposed_copy(4, 4096)),
        ("attn.decode", _attention(16, 1, 2048, llama8b, causal=False, window=None)),
        ("attn.prefill", _attention(1, 4096, 4096, llama8b, causal=True, window=None)),
        ("gemm.decode", _gemm(16, 14336, 4096)),
        ("gemm.prefill", _gemm(2048, 4096, 4096)),
    ]


def _writeback_sweep() -> list[SweepPoint]:
    return [
        SweepPoint(op, f"writeback.{name}", 1, (), WRITEBACK_TAG, mib << 20)
        for name, op in writeback_ops()
        for mib in WRITEBACK_MIB
    ]


def _cpu_sweep() -> list[SweepPoint]:
    """A tiny sweep of every kind at small sizes (tests, CI smoke)."""
    pts: list[SweepPoint] = [SweepPoint(Elementwise(id=0, fn="add", numel=1, hidden=1), "launch", 0, (), "launch")]
    pts += _series("gemm.256", (_gemm(m, 256, 256) for m in (1, 16, 128)), warm=(0,))
    pts += _series("gemm.512x256", (_gemm(m, 512, 256) for m in (1, 128)), warm=(0,))
    pts += _series("gemm.fp32", (_gemm(m, 256, 256, DType.fp32) for m in (1, 64)), base=1, warm=(0,))
    heads = (4, 2, 32)
    pts += _series("attn.decode", (_attention(1, 1, kv, heads, causal=False, window=None) for kv in (64, 256)))
    pts += _series("attn.prefill", (_attention(1, s, s, heads, causal=True, window=None) for s in (32, 128)))
    pts += _series("norm", (Norm(id=0, rows=t, hidden=256) for t in (1, 64)))
    pts += _series("rope", (Rope(id=0, tokens=t, heads=4, head_dim=32) for t in (1, 64)))
    pts += _series("act", (Activation(id=0, fn="swiglu", numel=t * 512, hidden=512, gated=True) for t in (1, 64)))
    pts += _series("ew.add", (Elementwise(id=0, fn="add", numel=t * 256, hidden=256) for t in (1, 64)))
    pts += _series("softmax", (Softmax(id=0, rows=t, cols=128) for t in (1, 64)))
    pts += _series("mem.copy", (Memory(id=0, fn="copy", numel=s) for s in (256, 65536)))
    pts += _series("embedding", (Embedding(id=0, tokens=t, vocab=1000, hidden=256) for t in (1, 64)))
    pts += _series(
        "moe.route", (MoeRouting(id=0, fn="route", tokens=t, experts=8, top_k=2, hidden=256) for t in (4, 64)), base=1
    )
    pts += _series(
        "moe.experts", (_experts("tiny", "down", t, 8, 2, 256, 128, "bmm") for t in (8, 64)), base=1, warm=(0,)
    )
    pts += _batched_mm_series("tiny", 8, 2, 256, 128, (1, 16), base=1)
    return pts


def sweep_points(
    device_type: str = "cuda", *, kinds: Iterable[str] = (), series: Iterable[str] = ()
) -> list[SweepPoint]:
    """The sweep for ``device_type`` (``cuda``: the full sweep; ``cpu``: a tiny one), ordered coarse to
    fine (:func:`order_points`), optionally only ops of ``kinds`` (``gemm``, ``attention``...) and only
    the series whose names start with one of ``series`` (``act.swiglu.chunked``: to add a regime to a
    profile without measuring the rest again)."""
    pts = _gpu_sweep() if device_type == "cuda" else _cpu_sweep()
    wanted = {k.strip() for k in kinds if k.strip()}
    if wanted:
        pts = [p for p in pts if str(getattr(p.op, "kind").value) in wanted or p.tag == "launch"]  # noqa: B009
    prefixes = tuple(s.strip() for s in series if s.strip())
    if prefixes:
        pts = [p for p in pts if p.series.startswith(prefixes)]
    seen: set[str] = set()
    unique = []
    for p in pts:
        if p.key not in seen:
            seen.add(p.key)
            unique.append(p)
    return order_points(unique)


def order_points(points: Iterable[SweepPoint]) -> list[SweepPoint]:
    """Most informative first: by level (:func:`coarse_to_fine` plus the series' base), and within a
    level round-robin over the series, so a sweep cut at any point has covered every regime evenly."""
    series: dict[str, int] = {}
    rank: dict[int, int] = {}
    keyed = []
    for i, p in enumerate(points):
        s = series.setdefault(p.series, len(series))
        keyed.append((p.level, rank.get(s, 0), s, i, p))
        rank[s] = rank.get(s, 0) + 1
    # Round-robin: the n-th point of each series at a level comes before the (n+1)-th of any.
    counters: dict[tuple[int, int], int] = {}
    out = []
    for level, _, s, i, p in keyed:
        n = counters.get((level, s), 0)
        counters[(level, s)] = n + 1
        out.append(((level, n, s, i), p))
    return [p for _, p in sorted(out, key=lambda x: x[0])]


REPEAT_PASSES = 3
"""Passes over the power-bound points (:func:`power_bound`): the sweep's own, then the others after it
(the second in reverse order), each at another moment of the GPU's power state; a point keeps the median."""
REPEAT_MIN_S = 50e-6
"""Shortest point measured in several passes (shorter compute-bound points are small GEMMs whose tiles,
not the clock, set their time; the passes stay cheap)."""
PASS_MARK = "@pass"
"""Parts-file key of a later pass of a point: ``KEY@pass2``."""


def power_bound(point: ProfilePoint, hardware: HardwareSpec | None) -> bool:
    """Whether ``point``'s time moves with the GPU's power state, so that the sweep measures it in
    several passes: compute-bound on ``hardware``'s roofline (its FLOPs per byte at or above the
    ridge point; any point when the device is not in the catalog) and at least :data:`REPEAT_MIN_S`."""
    if point.tag or point.seconds < REPEAT_MIN_S:
        return False
    if hardware is None:
        return True
    op = point.op
    return op.flops >= hardware.ridge_point(op.dtype) * max(op.bytes_read + op.bytes_written, 1)


def repeat_plan(
    plan: list[SweepPoint], points: dict[str, ProfilePoint], hardware: HardwareSpec | None, passes: int = REPEAT_PASSES
) -> list[tuple[str, SweepPoint]]:
    """The later passes over the measured power-bound points of ``plan`` (``(parts key, point)``;
    passes 2, 4... in reverse plan order, 3, 5... in plan order). ``points`` are keyed as in a parts file
    (first passes unfolded); a point that already holds its passes (resumed from a finished profile)
    is skipped, and the caller skips the later passes already done."""
    bound = [
        sp for sp in plan if sp.key in points and not points[sp.key].passes and power_bound(points[sp.key], hardware)
    ]
    return [
        (f"{sp.key}{PASS_MARK}{n}", sp) for n in range(2, passes + 1) for sp in (bound[::-1] if n % 2 == 0 else bound)
    ]


def fold_passes(points: dict[str, ProfilePoint]) -> dict[str, ProfilePoint]:
    """``points`` keyed as in a parts file, each point's later passes (``KEY@passN``) folded into it:
    its ``passes`` the time of every pass in order, ``seconds`` their median, ``samples`` their sum and
    the SM clock the median of the passes' clocks. A later pass of a point not measured is dropped."""
    later: dict[str, list[tuple[int, ProfilePoint]]] = {}
    out: dict[str, ProfilePoint] = {}
    for key, p in points.items():
        base, mark, n = key.partition(PASS_MARK)
        if mark and n.isdigit():
            later.setdefault(base, []).append((int(n), p))
        else:
            out[key] = p
    for key, reps in later.items():
        first = out.get(key)
        if first is None or first.passes:
            continue
        runs = [first, *(p for _, p in sorted(reps, key=lambda x: x[0]))]
        times = tuple(p.seconds for p in runs)
        clocks = [p.sm_clock_mhz for p in runs if p.sm_clock_mhz]
        out[key] = first.model_copy(
            update={
                "seconds": statistics.median(times),
                "passes": times,
                "samples": sum(p.samples for p in runs),
                "sm_clock_mhz": statistics.median(clocks) if clocks else None,
            }
        )
    return out


def sweep_key(point: ProfilePoint) -> str:
    """``point``'s key as the sweep keys it now: its op's config key (a profile's stored key is that of the sweep
    that measured it, and ops have been renamed since) with its tag's suffix as stored (``launch``, the
    write-back points' dirty MiB)."""
    return config_key(point.op) + ("-" + point.key.partition("-")[2] if point.tag else "")


def pool_profiles(profiles: Sequence[DeviceProfile]) -> DeviceProfile:
    """Sweeps of one device model (other machines, other hours) pooled into one profile: each point's time
    is the median of every time the sweeps measured for it (a compute-bound point's passes from each, the
    power state sampled more often; one time per sweep for the others), ``passes`` all of them. The first
    profile gives the points' ops, tags and host times, the launch floor, the issue time per aten call and
    the provenance (the host is not pooled: its speed differs from machine to machine, and the host profile
    is fitted on one sweep's times); points only later ones hold are added as measured. Profiles of other
    devices than the first's are refused."""
    if not profiles:
        raise ProfileError("no profiles to pool", where="--pool", hint="give two or more profiles of one device")
    first = profiles[0]
    for other in profiles[1:]:
        if other.device.hardware != first.device.hardware:
            raise ProfileError(
                f"a profile of {other.device.hardware or other.device.name!r} among profiles of "
                f"{first.device.hardware or first.device.name!r}",
                where="--pool",
                hint="pool sweeps of one device",
            )
    times: dict[str, list[float]] = {}
    points: dict[str, ProfilePoint] = {}
    for prof in profiles:
        for p in prof.points:
            key = sweep_key(p)
            points.setdefault(key, p.model_copy(update={"key": key}))
            times.setdefault(key, []).extend(p.passes or (p.seconds,))
    pooled = tuple(
        p.model_copy(update={"seconds": statistics.median(times[k]), "passes": tuple(times[k])})
        if len(times[k]) > 1
        else p
        for k, p in points.items()
    )
    dates = ", ".join(f"{p.device.name} {p.device.date}" for p in profiles)
    return first.model_copy(
        update={
            "points": pooled,
            "planned": max(p.planned for p in profiles),
            "complete": any(p.complete for p in profiles),
            "notes": (*first.notes, f"pooled from {len(profiles)} sweeps: {dates}"),
        }
    )


# -- timing and provenance ------------------------------------------------------------------------------


def sweep_timing(device_type: str, *, sessions: int = 3, max_sessions: int = 5) -> TimingConfig:
    """Timing for a sweep: as ``benchmarks/gpu/accuracy.py`` replays (cold L2, the activations read
    back, kernel sums), with fewer and shorter profiler sessions; on the CPU a few quick samples."""
    if device_type != "cuda":
        return TimingConfig(
            warmup_ms=1.0, min_warmup=1, min_samples=3, max_samples=15, max_time_s=0.03, target_ci=0.05,
            device_warmup_s=0.0,
        )  # fmt: skip
    return TimingConfig(
        cold_l2=True, warm_activations=True, warmup_ms=5.0, min_warmup=2, target_ci=0.01,
        kernel_sessions=sessions, max_kernel_sessions=max(sessions, max_sessions), kernel_session_ms=3.0,
        kernel_max_time_s=1.5, device_warmup_s=1.0,
    )  # fmt: skip


def sweep_options(timing: TimingConfig) -> ReplayOptions:
    """Replay options of a sweep: no numeric check or energy (speed), the SM clock sampled, host issue
    timed per op in bursts (a sweep has no graph order), small case tensors warm (the model just made them),
    as much of the L2 dirty as a ``writeback`` point asks."""
    return ReplayOptions(
        timing=timing, check=False, energy=False, sm_clock=True, issue_in_sequence=False, warm_aux_bytes=8 << 20,
        dirty_l2_fraction=1.0,
    )  # fmt: skip


_GPU_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h200",), "h200"),
    (("h100", "pcie"), "h100-pcie"),
    (("h100",), "h100-sxm"),
    (("a100",), "a100-80gb"),
    (("l40s",), "l40s"),
    (("a6000",), "a6000"),
    (("b200",), "b200"),
    (("mi300x",), "mi300x"),
    (("1080", "ti"), "gtx-1080-ti"),
)


def guess_hardware(device_name: str) -> str:
    """The catalog name of a device the driver calls ``device_name``, or ``""`` when unknown.

    >>> guess_hardware("NVIDIA H100 80GB HBM3")
    'h100-sxm'
    """
    low = device_name.lower()
    for words, name in _GPU_NAMES:
        if all(w in low for w in words):
            return name
    return ""


def _nvidia_smi() -> dict[str, str]:
    query = "driver_version,clocks.max.sm,clocks.max.mem"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    first = out.strip().splitlines()[0] if out.strip() else ""
    values = [v.strip() for v in first.split(",")]
    return dict(zip(query.split(","), values, strict=False))


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def provenance(rep: Replayer, hardware: str = "") -> ProfileDevice:
    """Where the sweep runs: device, driver, clocks, CUDA, torch, host CPU, the date."""
    import torch

    cuda = rep.device.type == "cuda"
    smi = _nvidia_smi() if cuda else {}
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.lower().startswith("model name")), cpu)
    except OSError:
        pass
    return ProfileDevice(
        name=rep.device_name if cuda else "cpu",
        hardware=hardware or (guess_hardware(rep.device_name) if cuda else ""),
        device_type=rep.device.type,
        max_sm_clock_mhz=_float(smi.get("clocks.max.sm")),
        memory_clock_mhz=_float(smi.get("clocks.max.mem")),
        driver=smi.get("driver_version", ""),
        cuda=str(torch.version.cuda or "") if cuda else "",
        torch=str(torch.__version__),
        host_cpu=cpu,
        python=platform.python_version(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
    )


# -- running --------------------------------------------------------------------------------------------


def _point(key: str, op: OpBase, r: ReplayResult, tag: str = "") -> ProfilePoint | None:
    """The profile point of replay result ``r`` of ``op`` (``None`` unless it timed ok)."""
    t = r.timing
    if r.status is not ReplayStatus.OK or t is None:
        return None
    return ProfilePoint(
        key=key,
        op=op,
        seconds=t.median_us * 1e-6,
        spread_s=t.iqr_us * 1e-6,
        samples=t.samples,
        host_s=t.host_us * 1e-6 if t.host_us is not None else None,
        host_ref_s=t.host_ref_us * 1e-6 if t.host_ref_us is not None else None,
        sm_clock_mhz=t.sm_clock_mhz,
        tag=tag,
        dirty_bytes=t.dirty_l2_bytes or 0,
    )


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _resume_state(
    parts: Path, device: ProfileDevice | None
) -> tuple[ProfileDevice, dict[str, ProfilePoint], set[str], int]:
    """The provenance, points done (ok), keys done (ok or failed) and unreadable lines of an earlier
    run's parts file; a parts file of another device than ``device`` is refused."""
    header, records, bad = read_parts(parts)
    try:
        before = ProfileDevice.model_validate(header) if header is not None else None
    except ValidationError:
        before = None
    if device is not None and before is not None and before.name and before.name != device.name:
        raise ProfileError(
            f"the parts file was measured on {before.name!r}, this device is {device.name!r}",
            where=str(parts),
            hint="resume on the same device, or start over without --resume",
        )
    info = device or before
    if info is None:
        raise ProfileError("the parts file has no readable header (where the sweep ran)", where=str(parts))
    points: dict[str, ProfilePoint] = {}
    done: set[str] = set()
    for rec in records:
        key = rec.get("key")
        if not isinstance(key, str):
            bad += 1
            continue
        if "point" in rec:
            try:
                points[key] = ProfilePoint.model_validate(rec["point"])
            except ValidationError:
                bad += 1
                continue
        done.add(key)
    return info, points, done, bad


def run_profile(
    out: str | Path,
    device: str = "cpu",
    *,
    points: list[SweepPoint] | None = None,
    budget_s: float | None = None,
    resume: bool = False,
    hardware: str = "",
    timing: TimingConfig | None = None,
    passes: int | None = None,
    on_point: Callable[[int, int, SweepPoint, ReplayResult | None], None] | None = None,
) -> DeviceProfile:
    """Replay the sweep on ``device`` and write the profile to ``out`` (its points stream to
    ``OUT.parts.jsonl``). Returns the profile.

    ``points`` defaults to :func:`sweep_points` for the device; ``budget_s`` stops cleanly before
    the next point would overrun it (the profile is then marked incomplete); ``resume`` keeps the
    parts file of an earlier run and skips what it holds; ``hardware`` is the catalog name the
    profile predicts for (guessed from the GPU's name when empty). The power-bound points are
    measured in ``passes`` passes (:func:`repeat_plan`; default :data:`REPEAT_PASSES` on a GPU, 1 on
    the CPU, where no power limit moves the clock). ``on_point(i, n, point, result)``
    is told about each point (``result`` ``None`` for one done in an earlier run).
    """
    if passes is not None and passes < 1:
        raise ProfileError(f"{passes} passes: give 1 or more", where="--passes")
    start = time.monotonic()
    if budget_s is not None and budget_s <= 0:
        raise ProfileError(f"budget {budget_s:g} s is not positive", where="--budget-s")
    out = Path(out)
    parts = parts_path(out)
    timing = timing or sweep_timing("cuda" if device.startswith("cuda") else "cpu")
    if hardware:
        from hardware import load_hardware

        hardware = load_hardware(hardware).name
    rep = Replayer(device, sweep_options(timing))
    n_passes = passes if passes is not None else (REPEAT_PASSES if rep.device.type == "cuda" else 1)
    try:
        plan = points if points is not None else sweep_points(rep.device.type)
        info = provenance(rep, hardware)
        done_points: dict[str, ProfilePoint] = {}
        done: set[str] = set()
        bad = 0
        out.parent.mkdir(parents=True, exist_ok=True)
        if resume and parts.exists():
            _, done_points, done, bad = _resume_state(parts, info)
        else:
            parts.write_text(json.dumps({"header": info.model_dump(mode="json")}) + "\n", encoding="utf-8")
        durations: list[float] = []
        lost: DeviceLostError | None = None

        def measure(todo: list[tuple[str, SweepPoint]], first: int, n: int) -> bool:
            """Replay each ``(parts key, point)`` not done; False once the budget or the device stops it."""
            nonlocal lost
            for i, (key, sp) in enumerate(todo, first):
                if key in done:
                    if on_point is not None:
                        on_point(i, n, sp, None)
                    continue
                if budget_s is not None and time.monotonic() - start + max(durations[-8:], default=0.0) > budget_s:
                    return False
                t0 = time.monotonic()
                cfg = OpConfig(
                    key=sp.key, op=sp.op, count=1, op_ids=[0], warm_inputs=sp.warm_inputs,
                    prev_write_bytes=sp.dirty_bytes,
                )  # fmt: skip
                try:
                    result = rep.replay(cfg)
                except DeviceLostError as exc:
                    _append(parts, {"key": key, "failed": f"device lost: {exc.message}"[:300]})
                    done.add(key)
                    lost = exc
                    return False
                durations.append(time.monotonic() - t0)
                point = _point(sp.key, sp.op, result, sp.tag)
                if point is not None:
                    done_points[key] = point
                    _append(parts, {"key": key, "point": point.model_dump(mode="json")})
                else:
                    _append(parts, {"key": key, "failed": f"{result.status.value}: {result.reason}"[:300]})
                done.add(key)
                if on_point is not None:
                    on_point(i, n, sp, result)
            return True

        finished = measure([(sp.key, sp) for sp in plan], 1, len(plan))
        repeats: list[tuple[str, SweepPoint]] = []
        if finished and n_passes > 1:
            spec = _catalog_spec(info.hardware)
            repeats = repeat_plan(plan, done_points, spec, n_passes)
            finished = measure(repeats, len(plan) + 1, len(plan) + len(repeats))
    finally:
        rep.close()
    profile = finish_profile(
        plan, done_points, done, info, timing, stopped=not finished, bad_lines=bad, passes=n_passes,
        repeats_left=sum(1 for key, _ in repeats if key not in done),
    )  # fmt: skip
    guessed = guess_hardware(info.name) if info.device_type == "cuda" else ""
    if guessed and info.hardware and guessed != info.hardware:
        note = f"measured on {info.name!r}, which looks like {guessed}, for --hardware {info.hardware}"
        profile = profile.model_copy(update={"notes": (*profile.notes, note)})
    profile.save(out)
    if lost is not None:
        raise ProfileError(
            f"the device became unusable ({lost.message}); the profile holds the {len(done_points)} points measured",
            where=str(out),
            hint="rerun with --resume in a fresh process: the failed point is recorded and skipped",
        )
    return profile


def profile_from_parts(
    out: str | Path, points: list[SweepPoint], timing: TimingConfig, *, hardware: str = ""
) -> DeviceProfile:
    """Write the profile ``out`` from its parts file alone, measuring nothing (after a sweep was killed,
    or to repair a truncated profile JSON): what is valid in the parts file is kept."""
    out = Path(out)
    parts = parts_path(out)
    if not parts.exists():
        raise ProfileError(
            "no parts file to rebuild the profile from",
            where=str(parts),
            hint="run the sweep first (without --from-parts)",
        )
    info, points_done, done, bad = _resume_state(parts, None)
    if hardware:
        info = info.model_copy(update={"hardware": hardware})
    profile = finish_profile(points, points_done, done, info, timing, bad_lines=bad)
    profile.save(out)
    return profile


def _catalog_spec(hardware: str) -> HardwareSpec | None:
    """The catalog device ``hardware`` names (``None`` when it names none)."""
    from hardware import load_hardware

    try:
        return load_hardware(hardware) if hardware else None
    except OpgraphError:
        return None


HOST_DRIFT = 1.2
"""A sweep whose median reference issue time is this many times its fastest says so in its notes."""


def finish_profile(
    plan: list[SweepPoint],
    points: dict[str, ProfilePoint],
    done: set[str],
    device: ProfileDevice,
    timing: TimingConfig,
    *,
    stopped: bool = False,
    bad_lines: int = 0,
    passes: int = 1,
    repeats_left: int = 0,
) -> DeviceProfile:
    """The :class:`DeviceProfile` of the measured ``points`` of ``plan`` (in plan order; later passes
    folded in, :func:`fold_passes`), with the launch floor and host time per aten call from the
    ``launch`` points. ``passes``: the passes the sweep planned over power-bound points, of which
    ``repeats_left`` measurements were not made (a budget stop)."""
    points = fold_passes(points)
    done = {k for k in done if PASS_MARK not in k}
    ordered = [points[p.key] for p in plan if p.key in points]
    ordered += [p for k, p in points.items() if k not in {sp.key for sp in plan}]
    passes = max([passes, *(len(p.passes) for p in ordered)])
    launch = [p for p in ordered if p.tag == "launch"]
    clocks = [p.sm_clock_mhz for p in ordered if p.sm_clock_mhz]
    failed = len([k for k in done if k not in points])
    notes = []
    if stopped and repeats_left:
        notes.append(
            f"stopped at the time budget with {repeats_left} later-pass measurement(s) of compute-bound points not"
            " made: those points keep the passes measured"
        )
    elif stopped:
        notes.append(f"stopped at the time budget after {len(done)} of {len(plan)} planned points")
    if failed:
        notes.append(f"{failed} point(s) failed (see the parts file)")
    if bad_lines:
        notes.append(f"{bad_lines} unreadable line(s) of the parts file skipped (a cut last line after a kill)")
    ref = fastest_ref(ordered)
    refs = [p.host_ref_s for p in ordered if p.host_ref_s]
    if ref and statistics.median(refs) > HOST_DRIFT * ref:
        notes.append(
            f"the host ran slower than its fastest for much of the sweep (a reference call took {ref * 1e6:.3g} us at"
            f" its fastest, {statistics.median(refs) * 1e6:.3g} at the median): host times are scaled to its fastest"
        )
    profile = DeviceProfile(
        device=device.model_copy(update={"sm_clock_mhz": statistics.median(clocks) if clocks else None}),
        timing={
            "timer": timing.timer,
            "cold_l2": timing.cold_l2,
            "warm_activations": timing.warm_activations,
            "sessions": timing.kernel_sessions,
            "max_sessions": timing.max_kernel_sessions,
            "session_ms": timing.kernel_session_ms,
            "target_ci": timing.target_ci,
            "passes": passes,
        },
        launch_us=min(p.seconds for p in launch) * 1e6 if launch else None,
        host_ref_us=ref * 1e6 if ref else None,
        points=tuple(ordered),
        planned=len(plan),
        complete=all(p.key in done for p in plan),
        notes=tuple(notes),
    )
    host = [h for p in launch if (h := profile.issue_s(p)) is not None]
    return profile.model_copy(update={"aten_issue_us": statistics.median(host) * 1e6 if host else None})


def profile_from_replays(results: Iterable[ReplayResult], *, hardware: str = "", name: str = "") -> DeviceProfile:
    """A :class:`DeviceProfile` of replay results (``opgraph replay`` JSONL, :func:`validators.load_results`):
    each ok config a point, its host issue time included. For profiles of a model's own ops (what
    leave-one-out evaluations exclude) or to extend a sweep with captured configs."""
    points: dict[str, ProfilePoint] = {}
    device = ""
    for r in results:
        point = _point(r.key, r.op, r) if r.key not in points else None
        if point is not None:
            device = device or r.device_name
            points[r.key] = point
    info = ProfileDevice(name=name or device, hardware=hardware or guess_hardware(name or device))
    ref = fastest_ref(points.values())
    return DeviceProfile(
        device=info, points=tuple(points.values()), planned=len(points), notes=("from replay results",),
        host_ref_us=ref * 1e6 if ref else None,
    )  # fmt: skip
