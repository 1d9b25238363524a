"""Aligning graph ops with a trace's aten calls inside one (step, layer) bucket (issue: compare --graph
paired the wrong ops).

The buckets are written by hand as eager PyTorch runs a Llama decode layer and a Qwen2 prefill layer (the
calls, their input dims as the profiler records them with ``record_shapes``, one kernel each), and the
graph ops as capture records that layer. Which op owns which kernel is the answer the test states: it
comes from the model's code (RoPE is ``q * cos + rotate_half(q) * sin``, the KV cache is
``torch.cat([past, new], dim=-2)``, SwiGLU is ``silu(gate(x)) * up(x)``), not from the aligner.
"""

from __future__ import annotations

from typing import Any

from opgraph.compare.align import Bucket, align_ops
from opgraph.ir import Activation, Attention, Elementwise, Memory, Norm, Rope, TensorSpec
from opgraph.ir.ops import OpBase
from opgraph.ir.timeline import KernelType, SpanCategory
from opgraph.trace.events import GpuEvent, HostEvent
from tests.ir_builders import BF16, T, call, mm, t

Dims = list[Any]


class Trace:
    """Kernels of one bucket, each launched by one aten call (with its enclosing calls), in time order."""

    def __init__(self) -> None:
        self.kernels: list[GpuEvent] = []
        self.labels: list[str] = []

    def run(self, label: str, ktype: KernelType, *calls: tuple[str, Dims]) -> None:
        """One kernel named ``label`` launched by ``calls`` (innermost first: ``("aten::mm", dims)``)."""
        ts = 10.0 * len(self.kernels)
        parent: HostEvent | None = None
        for name, dims in reversed(calls):
            parent = HostEvent(name, SpanCategory.CPU_OP, ts, 5.0, 1, 1, input_dims=dims, parent=parent)
        assert parent is not None
        self.kernels.append(
            GpuEvent(
                label,
                SpanCategory.KERNEL,
                ts,
                1.0 + len(self.kernels),
                0,
                7,
                launch_host=parent,
                launch_stack=tuple(name for name, _ in calls),
                ktype=ktype,
            )
        )
        self.labels.append(label)

    def owners(self, ops: list[OpBase]) -> dict[str, int | None]:
        """Kernel label -> id of the op that took it (None: no op)."""
        got, _ = align_ops(Bucket(step=1, layer=3, stage="decode", ops=ops, kernels=self.kernels))
        by_kernel = {id(g): op_id for op_id, ks in got.items() for g in ks}
        return {label: by_kernel.get(id(g)) for label, g in zip(self.labels, self.kernels, strict=True)}


def ts(*shape: int, tid: int | None = None) -> TensorSpec:
    return t(*shape, tid=tid)


def _norm(i: int, rows: int, hidden: int, x: int, out: int) -> Norm:
    return Norm(
        id=i, target="LlamaRMSNorm", rows=rows, hidden=hidden,
        inputs=(ts(1, rows, hidden, tid=x), ts(hidden)), outputs=(ts(1, rows, hidden, tid=out),),
    )  # fmt: skip


def _rope(i: int, heads: int, tokens: int, x: int, out: int, head_dim: int = 64) -> Rope:
    shape = (1, heads, tokens, head_dim)
    return Rope(
        id=i, target="rope", tokens=tokens, heads=heads, head_dim=head_dim,
        inputs=(ts(*shape, tid=x), ts(1, 1, tokens, head_dim), ts(1, 1, tokens, head_dim)),
        outputs=(ts(*shape, tid=out),),
    )  # fmt: skip


def _kv_write(i: int, past: tuple[int, ...], new: tuple[int, ...], new_tid: int) -> Memory:
    # the recorded call keeps the empty past of a prefill; the graph's input is then shape (0,)
    numel = 1
    for d in new:
        numel *= d
    return Memory(
        id=i, target="aten.cat.default", fn="kv_cache_write", numel=numel,
        inputs=(TensorSpec(shape=past, dtype=BF16), ts(*new, tid=new_tid)),
        call=call([T(0), T(1)], -2),
    )  # fmt: skip


def _add(i: int, shape: tuple[int, ...], a: int, b: int, out: int) -> Elementwise:
    return Elementwise(
        id=i, target="aten.add.Tensor", fn="add", numel=shape[-1] * shape[-2], hidden=shape[-1],
        inputs=(ts(*shape, tid=a), ts(*shape, tid=b)), outputs=(ts(*shape, tid=out),), call=call(T(0), T(1)),
    )  # fmt: skip


def _swiglu(i: int, shape: tuple[int, ...], gate: int, up: int, out: int) -> Activation:
    # fused from aten.silu (its target) and the gating aten.mul: no single recorded call
    return Activation(
        id=i, target="aten.silu.default", fn="swiglu", numel=shape[-1] * shape[-2], hidden=shape[-1], gated=True,
        inputs=(ts(*shape, tid=gate), ts(*shape, tid=up)), outputs=(ts(*shape, tid=out),),
    )  # fmt: skip


def _sdpa(i: int, heads: int, kv_heads: int, q_len: int, kv_len: int, q: int) -> Attention:
    return Attention(
        id=i, target="aten.scaled_dot_product_attention", batch=1, q_len=q_len, kv_len=kv_len, heads=heads,
        kv_heads=kv_heads, head_dim=64,
        inputs=(ts(1, heads, q_len, 64, tid=q), ts(1, kv_heads, kv_len, 64), ts(1, kv_heads, kv_len, 64)),
        call=call(T(0), T(1), T(2)),
    )  # fmt: skip


def _rope_calls(trace: Trace, who: str, heads: int, tokens: int) -> None:
    """``q * cos + rotate_half(q) * sin`` as eager PyTorch runs it: five kernels."""
    full, half, angle = [1, heads, tokens, 64], [1, heads, tokens, 32], [1, 1, tokens, 64]
    trace.run(f"{who}*cos", KernelType.ELEMENTWISE, ("aten::mul", [full, angle]))
    trace.run(f"{who} neg", KernelType.ELEMENTWISE, ("aten::neg", [half]))
    trace.run(f"{who} rotate_half cat", KernelType.MEMORY, ("aten::cat", [[half, half], []]))
    trace.run(f"{who}*sin", KernelType.ELEMENTWISE, ("aten::mul", [full, angle]))
    trace.run(f"{who} add", KernelType.ELEMENTWISE, ("aten::add", [full, full, []]))


def _linear(trace: Trace, label: str, m: int, k: int, n: int) -> None:
    trace.run(label, KernelType.GEMM, ("aten::mm", [[m, k], [k, n]]), ("aten::linear", [[1, m, k], [n, k], []]))


def _norm_calls(trace: Trace, label: str, rows: int, hidden: int) -> None:
    x = [1, rows, hidden]
    trace.run(f"{label} pow", KernelType.NORM, ("aten::pow", [x, []]))
    trace.run(f"{label} rsqrt", KernelType.NORM, ("aten::rsqrt", [[1, rows, 1]]))
    trace.run(f"{label} weight", KernelType.NORM, ("aten::mul", [[hidden], x]))


def test_a_decode_layer_pairs_kv_writes_rope_and_swiglu_with_all_their_calls() -> None:
    # Llama decode step (GQA, 32 query and 8 KV heads, 512 tokens cached): the KV-cache cats record a
    # tensor list, [[[1,8,512,64],[1,8,1,64]],[]]; RoPE's rotate_half cats are cats too, of other shapes.
    ops: list[OpBase] = [
        _norm(0, 1, 2048, x=1, out=2),
        mm(1, 1, 2048, 2048, tids=(2, None, 3)),
        mm(2, 1, 512, 2048, tids=(2, None, 4)),
        mm(3, 1, 512, 2048, tids=(2, None, 5)),
        _rope(4, 32, 1, x=3, out=6),
        _rope(5, 8, 1, x=4, out=7),
        _kv_write(6, (1, 8, 512, 64), (1, 8, 1, 64), new_tid=7),
        _kv_write(7, (1, 8, 512, 64), (1, 8, 1, 64), new_tid=5),
        _sdpa(8, 32, 8, 1, 513, q=6),
        mm(9, 1, 2048, 2048, tids=(9, None, 10)),
        _add(10, (1, 1, 2048), a=1, b=10, out=11),
        _norm(11, 1, 2048, x=11, out=12),
        mm(12, 1, 8192, 2048, tids=(12, None, 13)),
        mm(13, 1, 8192, 2048, tids=(12, None, 14)),
        _swiglu(14, (1, 1, 8192), gate=13, up=14, out=15),
        mm(15, 1, 2048, 8192, tids=(15, None, 16)),
        _add(16, (1, 1, 2048), a=11, b=16, out=17),
    ]
    tr = Trace()
    _norm_calls(tr, "input norm", 1, 2048)
    _linear(tr, "q_proj", 1, 2048, 2048)
    _linear(tr, "k_proj", 1, 2048, 512)
    _linear(tr, "v_proj", 1, 2048, 512)
    _rope_calls(tr, "q", 32, 1)
    _rope_calls(tr, "k", 8, 1)
    kv = [[[1, 8, 512, 64], [1, 8, 1, 64]], []]
    tr.run("k cache cat", KernelType.MEMORY, ("aten::cat", kv))
    tr.run("v cache cat", KernelType.MEMORY, ("aten::cat", kv))
    sdpa_dims = [[1, 32, 1, 64], [1, 8, 513, 64], [1, 8, 513, 64], [], [], [], [], []]
    tr.run("sdpa", KernelType.ATTENTION, ("aten::scaled_dot_product_attention", sdpa_dims))
    _linear(tr, "o_proj", 1, 2048, 2048)
    tr.run("residual add", KernelType.ELEMENTWISE, ("aten::add", [[1, 1, 2048], [1, 1, 2048], []]))
    _norm_calls(tr, "post norm", 1, 2048)
    _linear(tr, "gate_proj", 1, 2048, 8192)
    tr.run("silu", KernelType.ACTIVATION, ("aten::silu", [[1, 1, 8192]]))  # eager: before the up projection
    _linear(tr, "up_proj", 1, 2048, 8192)
    tr.run("gate*up", KernelType.ELEMENTWISE, ("aten::mul", [[1, 1, 8192], [1, 1, 8192]]))
    _linear(tr, "down_proj", 1, 8192, 2048)
    tr.run("residual add 2", KernelType.ELEMENTWISE, ("aten::add", [[1, 1, 2048], [1, 1, 2048], []]))
    rope_q = ["q*cos", "q neg", "q rotate_half cat", "q*sin", "q add"]
    rope_k = ["k*cos", "k neg", "k rotate_half cat", "k*sin", "k add"]
    expected = {
        **dict.fromkeys(["input norm pow", "input norm rsqrt", "input norm weight"], 0),
        "q_proj": 1, "k_proj": 2, "v_proj": 3,
        **dict.fromkeys(rope_q, 4), **dict.fromkeys(rope_k, 5),
        "k cache cat": 6, "v cache cat": 7, "sdpa": 8, "o_proj": 9, "residual add": 10,
        **dict.fromkeys(["post norm pow", "post norm rsqrt", "post norm weight"], 11),
        "gate_proj": 12, "up_proj": 13, "silu": 14, "gate*up": 14, "down_proj": 15, "residual add 2": 16,
    }  # fmt: skip
    assert tr.owners(ops) == expected


def test_a_prefill_without_kv_cache_leaves_the_cache_writes_unmatched() -> None:
    # Qwen2 prefill (MHA: 16 query and 16 KV heads, 559 tokens, batch 1) traced by a model that kept no KV
    # cache: the graph's cache writes (cat of an empty past and the new keys) have no call in the trace,
    # and RoPE's rotate_half cats, of other shapes, are not theirs. The two RoPEs read tensors of the same
    # shape: the five calls of the first repeat for the second.
    n = 559
    ops: list[OpBase] = [
        mm(1, n, 1024, 1024, tids=(1, None, 3)),
        mm(2, n, 1024, 1024, tids=(1, None, 4)),
        mm(3, n, 1024, 1024, tids=(1, None, 5)),
        _rope(4, 16, n, x=3, out=6),
        _rope(5, 16, n, x=4, out=7),
        _kv_write(6, (0,), (1, 16, n, 64), new_tid=7),
        _kv_write(7, (0,), (1, 16, n, 64), new_tid=5),
        _sdpa(8, 16, 16, n, n, q=6),
        mm(9, n, 1024, 1024, tids=(9, None, 10)),
    ]
    tr = Trace()
    for proj in ("q_proj", "k_proj", "v_proj"):
        _linear(tr, proj, n, 1024, 1024)
    _rope_calls(tr, "q", 16, n)
    _rope_calls(tr, "k", 16, n)
    sdpa_dims = [[1, 16, n, 64], [1, 16, n, 64], [1, 16, n, 64], [], [], [], [], []]
    tr.run("sdpa", KernelType.ATTENTION, ("aten::scaled_dot_product_attention", sdpa_dims))
    _linear(tr, "o_proj", n, 1024, 1024)
    got = tr.owners(ops)
    assert [got[f"q{s}"] for s in ("*cos", " neg", " rotate_half cat", "*sin", " add")] == [4] * 5
    assert [got[f"k{s}"] for s in ("*cos", " neg", " rotate_half cat", "*sin", " add")] == [5] * 5
    assert 6 not in got.values() and 7 not in got.values()
    assert (got["q_proj"], got["k_proj"], got["v_proj"], got["sdpa"], got["o_proj"]) == (1, 2, 3, 8, 9)


def test_a_trace_of_other_shapes_is_still_aligned_by_name_and_order() -> None:
    # The trace ran a batch the graph was not captured with: no call has the graph's shapes, so calls
    # are taken by name in order, as before.
    ops: list[OpBase] = [mm(1, 4, 64, 64), _add(2, (1, 4, 64), a=1, b=2, out=3), mm(3, 4, 64, 64)]
    tr = Trace()
    _linear(tr, "first", 8, 64, 64)
    tr.run("add", KernelType.ELEMENTWISE, ("aten::add", [[1, 8, 64], [1, 8, 64], []]))
    _linear(tr, "second", 8, 64, 64)
    assert tr.owners(ops) == {"first": 1, "add": 2, "second": 3}


def test_a_norms_first_kernel_left_at_the_end_of_the_layer_before_goes_to_the_norm() -> None:
    # The analyzer starts a layer at the norm's `pow`, so the norm's cast to fp32 (`x.to(torch.float32)`)
    # ends the layer before; the outside-layers bucket spans the pass and hands nothing over.
    from opgraph.compare.align import hand_over

    layer0, layer1, outside = Trace(), Trace(), Trace()
    _norm_calls(layer0, "norm 0", 1, 2048)
    _linear(layer0, "down_proj", 1, 8192, 2048)
    layer0.run("cast to fp32", KernelType.MEMORY, ("aten::copy_", [[1, 1, 2048], [1, 1, 2048], []]),
               ("aten::to", [[1, 1, 2048], [], [], [], []]))  # fmt: skip
    for k in layer0.kernels:
        k.ts += 100.0
    _norm_calls(layer1, "norm", 1, 2048)
    for k in layer1.kernels:
        k.ts += 200.0
    _linear(outside, "embedding", 1, 2048, 2048)
    outside.run("argmax", KernelType.SAMPLING, ("aten::argmax", [[1, 128256], [], []]))
    outside.kernels[-1].ts = 1000.0  # after every layer
    b_out = Bucket(1, None, "decode", [mm(20, 1, 2048, 2048)], outside.kernels)
    b0 = Bucket(1, 0, "decode", [_norm(3, 1, 2048, x=0, out=1), mm(1, 1, 2048, 8192)], layer0.kernels)
    b1 = Bucket(1, 1, "decode", [_norm(2, 1, 2048, x=1, out=2)], layer1.kernels)
    owners: dict[int, list[GpuEvent]] = {}
    for b in (b_out, b0, b1):
        owners.update(align_ops(b)[0])
    assert [g.name for g in owners[2]] == ["norm pow", "norm rsqrt", "norm weight"]
    hand_over([b_out, b0, b1], owners)
    assert [g.name for g in owners[2]] == ["cast to fp32", "norm pow", "norm rsqrt", "norm weight"]
    assert [g.name for g in owners[1]] == ["down_proj"] and [g.name for g in owners[20]] == ["embedding"]
    assert [g.name for g in owners[3]] == ["norm 0 pow", "norm 0 rsqrt", "norm 0 weight"]  # no argmax
