"""Small llama-like graphs written by hand from IR ops, for catalog, sweep and coverage tests.

Not a test module: loaded by path from the conftests of tests/opgraph/catalog, tests/validators/*.
"""

from __future__ import annotations

from opgraph.ir import (
    Activation,
    Attention,
    DType,
    Elementwise,
    Embedding,
    GraphMetadata,
    Norm,
    OpBase,
    OpGraph,
    Rope,
    Softmax,
    Stage,
    View,
)
from tests.ir_builders import T, call, mm, t


def llama_like(
    model: str = "tiny-llama",
    architecture: str = "LlamaForCausalLM",
    phase: str = "prefill",
    *,
    tokens: int | None = None,
    hidden: int = 64,
    inter: int = 128,
    vocab: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    layers: int = 2,
    dtype: DType = DType.bf16,
    kv_len: int = 32,
    with_softmax: bool = False,
    hardware: str | None = None,
) -> OpGraph:
    """A llama-shaped graph (16 tokens in prefill, one in decode unless ``tokens`` says).

    Embedding; per layer a norm, q/k/v/o and MLP GEMMs (``aten.mm`` with transposed weights),
    RoPE, attention, a residual ``aten.add`` and SwiGLU; a final norm and the lm head.
    """
    stage = Stage.PREFILL if phase == "prefill" else Stage.DECODE
    if tokens is None:
        tokens = 16 if phase == "prefill" else 1
    q_len = tokens if phase == "prefill" else 1
    kv = tokens if phase == "prefill" else kv_len
    head_dim = hidden // heads
    ops: list[OpBase] = []

    def add(op_cls: type[OpBase], **kw: object) -> None:
        kw.setdefault("stage", stage)
        kw.setdefault("dtype", dtype)
        ops.append(op_cls(id=len(ops), **kw))

    def linear(n: int, k: int, layer: int | None, scope: str) -> None:
        ops.append(mm(len(ops), tokens, n, k, dtype, layer=layer, scope=scope, stage=stage))

    add(
        Embedding,
        tokens=tokens,
        vocab=vocab,
        hidden=hidden,
        scope="model.embed_tokens",
        inputs=(t(1, tokens, dtype=DType.int64), t(vocab, hidden, dtype=dtype)),
        outputs=(t(1, tokens, hidden, dtype=dtype),),
    )
    for layer in range(layers):
        pre = f"model.layers.{layer}"
        add(Norm, rows=tokens, hidden=hidden, layer=layer, scope=f"{pre}.input_layernorm")
        linear(hidden, hidden, layer, f"{pre}.self_attn.q_proj")
        linear(kv_heads * head_dim, hidden, layer, f"{pre}.self_attn.k_proj")
        linear(kv_heads * head_dim, hidden, layer, f"{pre}.self_attn.v_proj")
        add(View, fn="view", layer=layer, scope=f"{pre}.self_attn")
        add(Rope, tokens=tokens, heads=heads, head_dim=head_dim, layer=layer, scope=f"{pre}.self_attn")
        add(
            Attention,
            batch=1,
            q_len=q_len,
            kv_len=kv,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            layer=layer,
            scope=f"{pre}.self_attn",
        )
        if with_softmax:
            add(Softmax, rows=tokens * heads, cols=kv, layer=layer, scope=f"{pre}.self_attn")
        linear(hidden, hidden, layer, f"{pre}.self_attn.o_proj")
        add(
            Elementwise,
            fn="add",
            numel=tokens * hidden,
            hidden=hidden,
            layer=layer,
            scope=pre,
            target="aten.add.Tensor",
            inputs=(t(tokens, hidden, dtype=dtype), t(tokens, hidden, dtype=dtype)),
            outputs=(t(tokens, hidden, dtype=dtype),),
            call=call(T(0), T(1), alpha=1),
        )
        add(Norm, rows=tokens, hidden=hidden, layer=layer, scope=f"{pre}.post_attention_layernorm")
        linear(inter, hidden, layer, f"{pre}.mlp.gate_proj")
        linear(inter, hidden, layer, f"{pre}.mlp.up_proj")
        add(Activation, fn="silu", numel=tokens * inter, hidden=inter, gated=True, layer=layer, scope=f"{pre}.mlp")
        linear(hidden, inter, layer, f"{pre}.mlp.down_proj")
    add(Norm, rows=tokens, hidden=hidden, scope="model.norm")
    linear(vocab, hidden, None, "lm_head")
    capture: dict[str, str | int | float | bool | None] = {"device": "meta", "batch": 1, "dtype": dtype.value}
    if hardware:
        capture["hardware"] = hardware
    md = GraphMetadata(model=model, architecture=architecture, phase=phase, num_layers=layers, capture=capture)
    return OpGraph(metadata=md, ops=tuple(ops))
