"""Hypothesis strategies for IR objects, shared by the IR property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from opgraph.ir import (
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    DType,
    Edge,
    EdgeKind,
    Elementwise,
    Gemm,
    GraphMetadata,
    Memory,
    Norm,
    OpBase,
    OpGraph,
    Rope,
    Softmax,
    Stage,
    TensorSpec,
    TopK,
    View,
)

dims = st.integers(min_value=1, max_value=4096)
dtypes = st.sampled_from([DType.bf16, DType.fp16, DType.fp32, DType.fp8_e4m3, DType.int64])
tensors = st.builds(
    TensorSpec, shape=st.lists(dims, min_size=0, max_size=4).map(tuple), dtype=dtypes, id=st.none() | st.integers(0, 99)
)


@st.composite
def attentions(draw: st.DrawFn, op_id: int = 0) -> Attention:
    kv_heads = draw(st.integers(1, 8))
    group = draw(st.integers(1, 8))
    kv_len = draw(st.integers(1, 4096))
    q_len = draw(st.integers(1, kv_len))
    return Attention(
        id=op_id,
        batch=draw(st.integers(1, 8)),
        q_len=q_len,
        kv_len=kv_len,
        heads=kv_heads * group,
        kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([64, 128, 192])),
        causal=draw(st.booleans()),
        window=draw(st.none() | st.integers(1, 4096)),
    )


def ops_for(op_id: int) -> st.SearchStrategy[OpBase]:
    """Any op kind with id ``op_id``."""
    common = {
        "id": st.just(op_id),
        "scope": st.sampled_from(["", "model.layers.0.mlp", "model.norm"]),
        "layer": st.none() | st.integers(0, 80),
        "stage": st.none() | st.sampled_from(list(Stage)),
        "inputs": st.lists(tensors, max_size=3).map(tuple),
        "dtype": dtypes,
    }
    return st.one_of(
        st.builds(Gemm, m=st.integers(0, 8192), n=dims, k=dims, batch=st.integers(1, 4), **common),
        attentions(op_id),
        st.builds(Norm, rows=st.integers(0, 4096), hidden=dims, **common),
        st.builds(Rope, tokens=st.integers(0, 4096), heads=st.integers(1, 64), head_dim=dims, **common),
        st.builds(Activation, fn=st.sampled_from(["silu", "gelu"]), numel=st.integers(0, 10**7), hidden=dims, **common),
        st.builds(Elementwise, fn=st.sampled_from(["add", "mul"]), numel=st.integers(0, 10**7), **common),
        st.builds(Softmax, rows=st.integers(0, 4096), cols=dims, **common),
        st.builds(TopK, rows=st.integers(0, 64), cols=dims, k=st.integers(1, 8), **common),
        st.builds(
            Collective,
            collective=st.sampled_from(list(CollectiveKind)),
            bytes=st.integers(0, 10**9),
            group_size=st.integers(1, 8),
            **common,
        ),
        st.builds(Memory, fn=st.sampled_from(["copy", "cat", "kv_cache_write"]), numel=st.integers(0, 10**7), **common),
        st.builds(View, **common),
    )


@st.composite
def graphs(draw: st.DrawFn, max_ops: int = 12) -> OpGraph:
    """A random DAG: edges only go from lower to higher program position."""
    n = draw(st.integers(0, max_ops))
    ids = draw(st.permutations(list(range(n * 3)))) if n else []
    ids = ids[:n]
    ops = tuple(draw(ops_for(i)) for i in ids)
    edges = []
    for j in range(n):
        for i in draw(st.lists(st.integers(0, max(0, j - 1)), max_size=3, unique=True)) if j else []:
            edges.append(Edge(src=ids[i], dst=ids[j], kind=draw(st.sampled_from(list(EdgeKind)))))
    return OpGraph(metadata=GraphMetadata(model="random", capture={"seed": 1}), ops=ops, edges=tuple(edges))
