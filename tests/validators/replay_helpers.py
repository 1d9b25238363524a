"""Small hand-built graphs for replay tests, shaped like what capture records (calls, strides, composites)."""

from __future__ import annotations

from opgraph.ir import (
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    DType,
    Elementwise,
    Embedding,
    Gemm,
    GraphMetadata,
    Memory,
    MoeRouting,
    Norm,
    OpBase,
    OpGraph,
    Other,
    Rope,
    Softmax,
    TopK,
    View,
)
from tests.ir_builders import T, call, mm, t
from validators import TimingConfig
from validators.replay import ReplayOptions

FP32 = DType.fp32

FAST = ReplayOptions(timing=TimingConfig(warmup_ms=0.5, min_warmup=1, min_samples=3, max_samples=5, max_time_s=0.02))
"""Replay options that keep unit tests quick (timing values are not asserted)."""


def tiny_ops(seq: int = 8, hidden: int = 32, heads: int = 4, kv_heads: int = 2, d: int = 8) -> list[OpBase]:
    """One of every kind replay handles, small enough for the CPU."""
    vocab, inter, experts, top_k = 64, 48, 4, 2
    q_strides = (seq * heads * d, d, heads * d, 1)
    ops: list[OpBase] = [
        Embedding(
            id=0, target="aten.embedding.default", tokens=seq, vocab=vocab, hidden=hidden,
            inputs=(t(vocab, hidden), t(1, seq, dtype=DType.int64)), call=call(T(0), T(1)),
        ),
        Memory(id=1, target="aten.arange.default", fn="fill", numel=seq, dtype=DType.int64,
               call=call(seq, pin_memory=False)),
        Memory(
            id=2, target="aten._to_copy.default", fn="cast", numel=seq * hidden, dtype=FP32,
            inputs=(t(1, seq, hidden),), call=call(T(0), dtype={"dtype": "fp32"}),
        ),
        Norm(id=3, target="LlamaRMSNorm", rows=seq, hidden=hidden, inputs=(t(1, seq, hidden), t(hidden))),
        mm(4, seq, heads * d, hidden),
        mm(5, seq, heads * d, hidden),  # same config as 4: counted twice
        Rope(id=6, target="rope", tokens=seq, heads=heads, head_dim=d,
             inputs=(t(1, heads, seq, d, strides=q_strides), t(1, 1, seq, d), t(1, 1, seq, d))),
        Memory(
            id=7, target="aten.cat.default", fn="kv_cache_write", numel=seq * kv_heads * d,
            inputs=(t(0), t(1, kv_heads, seq, d)), call=call([T(0), T(1)], -2),
        ),
        Attention(
            id=8, target="aten.scaled_dot_product_attention", batch=1, q_len=seq, kv_len=seq, heads=heads,
            kv_heads=kv_heads, head_dim=d,
            inputs=(t(1, heads, seq, d, strides=q_strides), t(1, kv_heads, seq, d), t(1, kv_heads, seq, d)),
            call=call(T(0), T(1), T(2), attn_mask=None, dropout_p=0.0, scale=d**-0.5, is_causal=True, enable_gqa=True),
        ),
        Attention(id=9, target="sdpa", batch=2, q_len=1, kv_len=seq, heads=heads, kv_heads=kv_heads, head_dim=d),
        Attention(id=10, target="sdpa", batch=1, q_len=4, kv_len=seq, heads=heads, kv_heads=kv_heads, head_dim=d),
        Memory(
            id=11, target="aten.clone.default", fn="copy", numel=seq * heads * d,
            inputs=(t(1, seq, heads, d, strides=(seq * heads * d, d, seq * d, 1)),),
            call=call(T(0), memory_format="torch.contiguous_format"),
        ),
        Elementwise(id=12, target="aten.add.Tensor", fn="add", numel=seq * hidden, hidden=hidden,
                    inputs=(t(1, seq, hidden), t(1, seq, hidden)), call=call(T(0), T(1))),
        Activation(id=13, target="aten.silu.default", fn="swiglu", numel=seq * inter, hidden=inter, gated=True,
                   inputs=(t(1, seq, inter), t(1, seq, inter))),
        Gemm(id=14, target="aten.mm.default", m=seq, n=experts, k=hidden),  # no call: typed F.linear
        MoeRouting(id=15, target="Qwen3MoeTopKRouter", fn="route", tokens=seq, experts=experts, top_k=top_k,
                   hidden=hidden, inputs=(t(seq, experts),)),
        MoeRouting(id=16, target="moe_dispatch", fn="dispatch", tokens=seq, experts=experts, top_k=top_k,
                   hidden=hidden, inputs=(t(seq, hidden),)),
        Gemm(
            id=17, target="moe_experts_gate_up", m=seq * top_k // experts, n=2 * inter, k=hidden, groups=experts,
            definition=f"moe_bmm_e{experts}_h{hidden}_i{inter}_topk{top_k}_gate_up",
            inputs=(t(experts, seq * top_k // experts, hidden),
                    t(experts, hidden, 2 * inter, strides=(2 * inter * hidden, 1, hidden))),
            call=call(T(0), T(1)),
        ),
        Activation(id=18, target="aten.silu.default", fn="swiglu", numel=seq * top_k * inter, hidden=inter,
                   gated=True, inputs=(t(experts, seq * top_k // experts, inter, strides=(
                       seq * top_k // experts * 2 * inter, 2 * inter, 1)),)),
        Gemm(id=19, target="moe_experts_down", m=seq * top_k // experts, n=hidden, k=inter, groups=experts,
             definition="moe_loop_down"),
        MoeRouting(id=20, target="moe_combine", fn="combine", tokens=seq, experts=experts, top_k=top_k,
                   hidden=hidden),
        Softmax(id=21, target="softmax", rows=seq, cols=vocab),
        TopK(id=22, target="aten.topk.default", fn="topk", rows=seq, cols=experts, k=top_k,
             inputs=(t(seq, experts, dtype=FP32),), call=call(T(0), top_k)),
        Gemm(id=23, m=2, n=8, k=16, batch=3),
        View(id=24, target="aten.view.default", inputs=(t(seq, hidden),)),
        Other(id=25, target="mylib.fancy_op.default", fn="fancy_op"),
        Collective(id=26, target="all_reduce", collective=CollectiveKind.ALL_REDUCE, bytes=4096, group_size=2),
        Memory(id=27, target="aten.index_select.default", fn="index", numel=4 * hidden,
               inputs=(t(seq, hidden), t(4, dtype=DType.int64)), call=call(T(0), 0, T(1))),
        Elementwise(id=28, target="aten.rsqrt.default", fn="rsqrt", numel=seq, hidden=1,
                    inputs=(t(seq, 1, dtype=FP32),), call=call(T(0))),
    ]  # fmt: skip
    return ops


def tiny_graph(model: str = "tiny", phase: str = "prefill", ops: list[OpBase] | None = None) -> OpGraph:
    """A graph of :func:`tiny_ops` (no edges: replay does not need them)."""
    return OpGraph(metadata=GraphMetadata(model=model, phase=phase), ops=tuple(ops or tiny_ops()))


def gemm_graph(model: str = "gemms", sizes: tuple[int, ...] = (8, 16, 24)) -> OpGraph:
    """A graph of a few distinct small GEMMs (fast to replay), each used twice."""
    ops: list[OpBase] = []
    for i, n in enumerate(sizes):
        ops.append(mm(2 * i, 4, n, 16))
        ops.append(mm(2 * i + 1, 4, n, 16))
    return OpGraph(metadata=GraphMetadata(model=model, phase="prefill"), ops=tuple(ops))
