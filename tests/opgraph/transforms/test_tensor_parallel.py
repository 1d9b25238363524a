"""Megatron-style tensor-parallel sharding of captured graphs (``opgraph.transforms``)."""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opgraph.ir import (
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    DType,
    EdgeKind,
    Gemm,
    Memory,
    OpBase,
    OpGraph,
    OpgraphError,
    OpKind,
    Rope,
    TensorSpec,
    parse_op,
)
from opgraph.transforms import (
    DEFAULT_LINEAR_RULES,
    LinearRule,
    ParallelStyle,
    TensorParallelError,
    linear_style,
    shard_tensor_parallel,
)

MODELS = ("llama-3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "deepseek-v3", "bloom-560m")


@cache
def decode(model: str) -> OpGraph:
    """A 2-layer decode step of ``model`` (batch 8, kv_len 2048), captured on meta once per session."""
    from opgraph.capture import capture

    return capture(model, phase="decode", batch=8, kv_len=2048, layers=2)


def gemm_flops(graph: OpGraph, weights: bool | None = None) -> int:
    """FLOPs of the GEMMs (``weights``: only the layers' products, or only the activations' ``bmm``)."""
    return sum(
        o.flops for o in graph.ops if o.kind is OpKind.GEMM and (weights is None or weights is ("bmm" not in o.target))
    )


def successors(graph: OpGraph, op_id: int) -> list[OpBase]:
    return [graph.op(e.dst) for e in graph.edges if e.src == op_id and e.kind is EdgeKind.DATA]


def collectives(graph: OpGraph, kind: CollectiveKind | None = None) -> list[Collective]:
    out = [o for o in graph.ops if isinstance(o, Collective)]
    return [o for o in out if kind is None or o.collective is kind]


# ---------------------------------------------------------------- llama: the dense decoder
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_llama_gemm_flops_per_rank_are_total_over_tp(tp: int) -> None:
    g = decode("llama-3.1-70b")
    s = shard_tensor_parallel(g, tp)
    assert gemm_flops(s, weights=True) == pytest.approx(gemm_flops(g, weights=True) / tp, rel=1e-9)
    # transformers 5.17's RoPE angles (a bmm inv_freq @ positions) run whole on every rank
    assert gemm_flops(s, weights=False) == gemm_flops(g, weights=False)
    attn = sum(o.flops for o in g.ops_of(OpKind.ATTENTION))
    assert sum(o.flops for o in s.ops_of(OpKind.ATTENTION)) == pytest.approx(attn / tp, rel=1e-9)


def test_llama_one_all_reduce_after_each_row_parallel_linear() -> None:
    g, tp = decode("llama-3.1-70b"), 2
    s = shard_tensor_parallel(g, tp)
    rows = [o for o in s.ops if re.search(r"\.(o_proj|down_proj)$", o.scope) and isinstance(o, Gemm)]
    assert len(rows) == 2 * 2  # two per layer, two layers
    for gemm in rows:
        old = g.op(gemm.id)
        assert isinstance(old, Gemm) and gemm.k == old.k // tp and gemm.n == old.n
        nxt = successors(s, gemm.id)
        assert len(nxt) == 1, f"{gemm.scope} feeds {nxt}"
        ar = nxt[0]
        assert isinstance(ar, Collective) and ar.collective is CollectiveKind.ALL_REDUCE
        assert ar.group_size == tp and ar.bytes == gemm.m * gemm.n * DType.bf16.itemsize
        # Every op that read the GEMM's output now reads the all-reduce's output.
        before = {o.id for o in successors(g, gemm.id)}
        assert {o.id for o in successors(s, ar.id)} == before
        out_id = ar.outputs[0].id
        for consumer in successors(s, ar.id):
            assert out_id in {t.id for t in consumer.inputs}
            assert gemm.outputs[0].id not in {t.id for t in consumer.inputs}
    # Plus the vocab-parallel embedding's all-reduce and the logits' all-gather: nothing else.
    assert len(collectives(s, CollectiveKind.ALL_REDUCE)) == 2 * 2 + 1
    (ag,) = collectives(s, CollectiveKind.ALL_GATHER)
    assert ag.scope == "lm_head" and ag.outputs[0].shape[-1] == g.ops[-1].outputs[0].shape[-1]


def test_inserted_collectives_run_where_the_op_they_follow_ran() -> None:
    g = decode("llama-3.1-70b")
    # Give every op a step and a measured host gap: the step carries over, the host gap is the op's own.
    g = g.model_copy(update={"ops": tuple(o.model_copy(update={"step": 1, "host_gap_us": 3.0}) for o in g.ops)})
    s = shard_tensor_parallel(g, 2)
    rows = [o for o in s.ops if re.search(r"\.(o_proj|down_proj)$", o.scope) and isinstance(o, Gemm)]
    assert rows
    for gemm in rows:
        (ar,) = successors(s, gemm.id)
        assert isinstance(ar, Collective)
        assert (ar.scope, ar.layer, ar.stage, ar.step) == (gemm.scope, gemm.layer, gemm.stage, 1)
        assert ar.layer is not None and ar.stage is not None
        assert ar.host_gap_us is None and ar.id != gemm.id


def test_llama_attention_heads_and_kv_cache_divided() -> None:
    g = decode("llama-3.1-70b")
    for tp in (2, 8):
        s = shard_tensor_parallel(g, tp)
        for old, new in zip(g.ops_of(OpKind.ATTENTION), s.ops_of(OpKind.ATTENTION), strict=True):
            assert isinstance(old, Attention) and isinstance(new, Attention)
            assert (new.heads, new.kv_heads) == (old.heads // tp, old.kv_heads // tp)
            assert new.definition == f"gqa_paged_decode_h{old.heads // tp}_kv{old.kv_heads // tp}_d{old.head_dim}"
            assert [t.numel * tp for t in new.inputs] == [t.numel for t in old.inputs]
        for old, new in zip(g.ops_of(OpKind.ROPE), s.ops_of(OpKind.ROPE), strict=True):
            assert isinstance(old, Rope) and isinstance(new, Rope) and new.heads * tp == old.heads
        writes = [(o, s.op(o.id)) for o in g.ops_of(OpKind.MEMORY) if o.definition.startswith("kv_cache_write")]
        assert writes
        for old, new in writes:
            assert isinstance(old, Memory) and isinstance(new, Memory)
            assert new.bytes_written * tp == old.bytes_written and new.numel * tp == old.numel


def test_kv_heads_fewer_than_tp_are_replicated() -> None:
    g = decode("llama-3.1-70b")  # 64 heads, 8 KV heads
    s = shard_tensor_parallel(g, 16)
    for a in s.ops_of(OpKind.ATTENTION):
        assert isinstance(a, Attention) and (a.heads, a.kv_heads) == (4, 1)
    k_proj = next(o for o in s.ops if o.scope.endswith("self_attn.k_proj"))
    assert isinstance(k_proj, Gemm) and k_proj.n == 128  # one head of 128 per rank
    q_proj = next(o for o in s.ops if o.scope.endswith("self_attn.q_proj"))
    assert isinstance(q_proj, Gemm) and q_proj.n == 8192 // 16


def test_norms_residuals_and_router_stay_replicated() -> None:
    for model in ("llama-3.1-70b", "mixtral-8x7b"):
        g = decode(model)
        s = shard_tensor_parallel(g, 2)
        for old in g.ops:
            new = s.op(old.id)
            if old.kind is OpKind.NORM or re.search(r"^model\.layers\.\d+$", old.scope):
                assert (new.flops, new.total_bytes, new.definition) == (old.flops, old.total_bytes, old.definition)
            if old.scope.endswith("mlp.gate") and old.kind is OpKind.GEMM:
                assert new.definition == old.definition and new.flops == old.flops


def test_metadata_ids_and_lint() -> None:
    g = decode("llama-3.1-70b")
    s = shard_tensor_parallel(g, 4)
    s.lint()
    assert s.metadata.capture["tp"] == 4 and g.metadata.capture.get("tp") is None
    line = next(a for a in s.metadata.assumptions if a.startswith("tensor parallel tp=4"))
    assert "column-parallel" in line and "all-reduce" in line
    assert [o.id for o in s.ops if o.kind is not OpKind.COLLECTIVE] == [o.id for o in g.ops]
    assert min(o.id for o in collectives(s)) > max(o.id for o in g.ops)
    assert OpGraph.model_validate_json(s.model_dump_json()) == s
    assert shard_tensor_parallel(g, 1).ops == g.ops


# ---------------------------------------------------------------- every model: consistency
@pytest.mark.parametrize("model", MODELS)
def test_sharded_graph_is_consistent(model: str) -> None:
    g = decode(model)
    tp = 2
    s = shard_tensor_parallel(g, tp)
    s.lint()
    old_by_id = {o.id: o for o in g.ops}
    for op in s.ops:
        # FLOPs, bytes and definition agree with the op's own fields where the capture's did.
        old = old_by_id.get(op.id)
        again = parse_op(
            {
                k: v
                for k, v in op.model_dump().items()
                if k not in ("flops", "bytes_read", "bytes_written", "definition")
            }
        )
        if old is None or old.flops == int(old.default_flops()):
            assert op.flops == again.flops, op
        if old is None or (old.bytes_read, old.bytes_written) == tuple(int(x) for x in old.default_bytes()):
            assert (op.bytes_read, op.bytes_written) == (again.bytes_read, again.bytes_written), op
        if old is None or old.definition == old.default_definition():
            assert op.definition == again.definition

    # A tensor keeps one size along every data edge where the capture had one.
    def numel_of(graph: OpGraph, op_id: int, tensor: int, side: str) -> int | None:
        specs = graph.op(op_id).outputs if side == "out" else graph.op(op_id).inputs
        return next((t.numel for t in specs if t.id == tensor), None)

    old_equal = {
        (e.src, e.dst, e.tensor)
        for e in g.edges
        if e.tensor is not None and numel_of(g, e.src, e.tensor, "out") == numel_of(g, e.dst, e.tensor, "in")
    }
    checked = 0
    for e in s.edges:
        if e.tensor is None:
            continue
        if e.src in old_by_id and e.dst in old_by_id and (e.src, e.dst, e.tensor) not in old_equal:
            continue
        a, b = numel_of(s, e.src, e.tensor, "out"), numel_of(s, e.dst, e.tensor, "in")
        if a != b:
            # A rank may read its slice of a whole tensor (ALiBi slopes, a bias), locally: a view.
            src = s.op(e.src)
            assert a == (b or 0) * tp and src == g.op(e.src), (
                f"{model}: edge {e.src}->{e.dst} tensor {e.tensor}: {a} vs {b}"
            )
        checked += 1
    assert checked > len(s.edges) // 2
    # Per-rank work really shrank.
    assert gemm_flops(s) < gemm_flops(g) * 0.6
    assert collectives(s, CollectiveKind.ALL_REDUCE)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(("llama-3.1-70b", "qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b")),
    tp=st.sampled_from((2, 4, 8)),
    embedding=st.sampled_from(("vocab_parallel", "replicated")),
    lm_head=st.sampled_from(("vocab_parallel", "replicated")),
    ep=st.booleans(),
)
def test_sharding_invariants(model: str, tp: int, embedding: str, lm_head: str, ep: bool) -> None:
    g = decode(model)
    try:
        s = shard_tensor_parallel(g, tp, embedding=embedding, lm_head=lm_head, expert_parallel=ep)  # type: ignore[arg-type]
    except TensorParallelError as exc:
        # Only a real divisibility problem may refuse: name the op and the dimension.
        assert "not divisible" in str(exc) or "do not divide" in str(exc)
        return
    s.lint()
    colls = collectives(s)
    assert all(tp % c.group_size == 0 for c in colls)
    # Every collective reads what its producer wrote and feeds at least one op, or ends the graph.
    for c in colls:
        preds = [e.src for e in s.edges if e.dst == c.id]
        assert len(preds) == 1
        src = s.op(preds[0])
        assert c.inputs[0].id in {t.id for t in src.outputs}
    n_ag = len(collectives(s, CollectiveKind.ALL_GATHER))
    assert n_ag == (1 if lm_head == "vocab_parallel" else 0)
    has_emb_ar = any(c.scope.endswith("embed_tokens") for c in colls)
    assert has_emb_ar == (embedding == "vocab_parallel")
    assert gemm_flops(s) < gemm_flops(g)


# ---------------------------------------------------------------- MoE
def test_moe_experts_split_inside_and_reduced_after_combine() -> None:
    g, tp = decode("qwen3-30b-a3b"), 4
    s = shard_tensor_parallel(g, tp)
    experts = [o for o in s.ops if isinstance(o, Gemm) and o.scope.endswith("mlp.experts")]
    assert len(experts) == 4
    for e in experts:
        old = g.op(e.id)
        assert isinstance(old, Gemm) and e.groups == old.groups
        if e.target.endswith("gate_up"):
            assert e.n * tp == old.n and e.k == old.k
        else:
            assert e.k * tp == old.k and e.n == old.n
        assert e.flops * tp == old.flops
        inter = int(re.search(r"_i(\d+)_", old.definition).group(1))  # type: ignore[union-attr]
        assert f"_i{inter // tp}_" in e.definition
    combines = [o for o in s.ops if o.kind is OpKind.MOE_ROUTING and getattr(o, "fn", "") == "combine"]
    for comb in combines:
        (ar,) = [o for o in successors(s, comb.id) if isinstance(o, Collective)]
        assert ar.collective is CollectiveKind.ALL_REDUCE and ar.bytes == comb.outputs[0].nbytes
    for e in experts:
        if e.target.endswith("down"):
            assert not any(isinstance(o, Collective) for o in successors(s, e.id))


def test_expert_parallel_splits_experts() -> None:
    # Batch 8 picking 2 of 8 experts reaches 7 of them: each rank is modelled as the busier one, 4.
    g, tp = decode("mixtral-8x7b"), 2
    s = shard_tensor_parallel(g, tp, expert_parallel=True)
    for old in g.ops:
        if isinstance(old, Gemm) and old.scope.endswith("mlp.experts"):
            new = s.op(old.id)
            assert isinstance(new, Gemm)
            assert old.groups == 7
            assert (new.groups, new.m, new.n, new.k) == (4, old.m, old.n, old.k)
            assert new.definition.endswith(f"_ep{tp}")
    assert "expert-parallel" in " ".join(s.metadata.assumptions)


def _batched_mm_graph(tmp_path: Path, model_type: str) -> OpGraph:
    """A 2-layer prefill (12 tokens) of a tiny ``model_type`` whose experts run transformers'
    ``batched_mm``, its expert sizes all distinct (hidden 64, intermediate 48: gate_up is 96 x 64)."""
    pytest.importorskip("transformers")
    from opgraph.capture import capture
    from tests.opgraph.capture.test_capture_architectures import BASE, TINY

    arch, extra = TINY[model_type]
    cfg = {**BASE, **extra, "model_type": model_type, "architectures": [arch], "experts_implementation": "batched_mm"}
    cfg["moe_intermediate_size" if model_type == "qwen3_moe" else "intermediate_size"] = 48
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(cfg))
    return capture(str(path), device="meta", seq_len=12)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_batched_mm_experts_split_their_gathered_weights(tmp_path: Path, model_type: str) -> None:
    """transformers' ``batched_mm`` experts run one bmm per projection of each token-expert pair's
    gathered weight copy against its token: weight first (qwen3_moe: ``[n, k] @ [k, 1]``) or token
    first (gpt_oss stores its weights transposed: ``[1, k] @ [k, n]``). As Megatron shards experts, each
    rank holds n / tp of every expert's gate_up and k / tp of its down: it gathers copies of its slices
    and multiplies its tokens, whole for gate_up, split for down, by them."""
    g, tp = _batched_mm_graph(tmp_path, model_type), 2
    s = shard_tensor_parallel(g, tp)
    wrote = {t.id: o for o in g.ops for t in o.outputs}
    wrote_s = {t.id: o for o in s.ops for t in o.outputs}
    gemms = [o for o in g.ops if isinstance(o, Gemm) and "batched_mm" in o.definition]
    assert len(gemms) == 4
    assert sum(s.op(o.id).flops for o in gemms) * tp == sum(o.flops for o in gemms)
    for old in gemms:
        new = s.op(old.id)
        assert isinstance(new, Gemm) and new.flops * tp == old.flops and new.batch == old.batch
        gate_up = old.target.endswith("gate_up")
        assert (new.n * tp, new.k) == (old.n, old.k) if gate_up else (new.n, new.k * tp) == (old.n, old.k)
        # The weight operand is the copy the gather wrote; the other one is the pairs' tokens.
        (w,) = [j for j, t in enumerate(old.inputs) if isinstance(wrote.get(t.id), Memory)]
        weight, token = old.inputs[w], old.inputs[1 - w]
        assert weight.numel == old.batch * old.n * old.k and token.numel == old.batch * old.k
        split = old.n if gate_up else old.k
        dim = [d for d, size in enumerate(weight.shape) if size == split]
        assert len(dim) == 1 and dim[0] > 0
        want = tuple(size // tp if d == dim[0] else size for d, size in enumerate(weight.shape))
        assert new.inputs[w].shape == want
        assert new.inputs[1 - w].numel * (1 if gate_up else tp) == token.numel
        # Each rank gathers copies of its slice of the experts' weights: no all-gather rebuilds them.
        gather = wrote_s.get(new.inputs[w].id)
        assert isinstance(gather, Memory) and gather.fn == "index"
        assert gather.outputs[0].shape == want and gather.numel * tp == g.op(gather.id).numel  # type: ignore[attr-defined]
    gathered = {o.inputs[0].shape for o in collectives(s, CollectiveKind.ALL_GATHER)}
    assert gathered <= {o.outputs[0].shape for o in s.ops if o.scope.endswith("lm_head")}


def test_mla_down_projections_replicated_up_projections_split() -> None:
    g, tp = decode("deepseek-v3"), 8
    s = shard_tensor_parallel(g, tp)
    for old in g.ops:
        if not isinstance(old, Gemm):
            continue
        new = s.op(old.id)
        assert isinstance(new, Gemm)
        if old.scope.endswith(("q_a_proj", "kv_a_proj_with_mqa")):
            assert new.n == old.n and new.k == old.k
        if old.scope.endswith(("q_b_proj", "kv_b_proj")):
            assert new.n * tp == old.n
    for a in s.ops_of(OpKind.ATTENTION):
        assert isinstance(a, Attention) and a.heads == 128 // tp and a.variant.value == "mla"


# ---------------------------------------------------------------- rules and unknown GEMMs
def test_rules_table_is_data() -> None:
    def gemm(scope: str, target: str = "aten.mm.default") -> Gemm:
        return Gemm(id=0, m=1, n=8, k=8, scope=scope, target=target)

    cases = {
        "model.layers.3.self_attn.q_proj": ParallelStyle.COLUMN,
        "transformer.h.0.self_attention.query_key_value": ParallelStyle.COLUMN,
        "model.layers.3.self_attn.o_proj": ParallelStyle.ROW,
        "transformer.h.0.self_attention.dense": ParallelStyle.ROW,
        "model.layers.0.mlp.down_proj": ParallelStyle.ROW,
        "model.layers.0.mlp.gate": ParallelStyle.REPLICATED,
        "model.layers.0.self_attn.kv_a_proj_with_mqa": ParallelStyle.REPLICATED,
        "lm_head": ParallelStyle.VOCAB,
    }
    for scope, style in cases.items():
        rule = linear_style(gemm(scope))
        assert rule is not None and rule.style is style, scope
    assert linear_style(gemm("model.layers.0.mlp.experts", "moe_experts_down")).style is ParallelStyle.ROW  # type: ignore[union-attr]
    assert linear_style(gemm("model.layers.0.mlp.experts", "moe_experts_gate_up")).style is ParallelStyle.COLUMN  # type: ignore[union-attr]
    assert linear_style(gemm("model.layers.0.mlp.mystery")) is None
    custom = (LinearRule(r"\.mystery$", ParallelStyle.COLUMN), *DEFAULT_LINEAR_RULES)
    assert linear_style(gemm("model.layers.0.mlp.mystery"), custom).style is ParallelStyle.COLUMN  # type: ignore[union-attr]


def test_unknown_gemm_left_replicated_and_listed() -> None:
    g = decode("llama-3.1-70b")
    target = next(o for o in g.ops if o.scope == "model.layers.1.mlp.gate_proj")
    odd = g.model_copy(
        update={
            "ops": tuple(
                o.model_copy(update={"scope": "model.layers.1.mlp.mystery"}) if o.id == target.id else o for o in g.ops
            )
        }
    )
    s = shard_tensor_parallel(odd, 2)
    new = s.op(target.id)
    assert (new.flops, new.definition) == (target.flops, target.definition)
    line = next(a for a in s.metadata.assumptions if "no sharding rule" in a)
    assert f"{target.id} model.layers.1.mlp.mystery" in line
    # Its output is whole; the gated activation takes its rank's slice of it, locally.
    act = next(o for o in successors(s, target.id) if o.kind is OpKind.ACTIVATION)
    before = g.op(act.id)
    assert isinstance(act, Activation) and isinstance(before, Activation) and act.numel * 2 == before.numel


def test_split_tensor_read_whole_gets_an_all_gather() -> None:
    # A row-parallel GEMM whose output feeds a replicated (unknown) GEMM that reads a split tensor.
    x = TensorSpec(shape=(4, 64), dtype=DType.bf16, id=0)
    w1 = TensorSpec(shape=(64, 128), dtype=DType.bf16, id=1)
    h = TensorSpec(shape=(4, 128), dtype=DType.bf16, id=2)
    w2 = TensorSpec(shape=(128, 32), dtype=DType.bf16, id=3)
    y = TensorSpec(shape=(4, 32), dtype=DType.bf16, id=4)
    from opgraph.ir import Edge

    g = OpGraph(
        ops=(
            Gemm(id=0, m=4, n=128, k=64, inputs=(x, w1), outputs=(h,), scope="mlp.up_proj"),
            Gemm(id=1, m=4, n=32, k=128, inputs=(h, w2), outputs=(y,), scope="mlp.odd"),
        ),
        edges=(Edge(src=0, dst=1, tensor=2),),
    )
    s = shard_tensor_parallel(g, 4)
    (ag,) = collectives(s)
    assert ag.collective is CollectiveKind.ALL_GATHER and ag.bytes == 4 * 32 * 2 and ag.outputs[0].shape == (4, 128)
    assert [o.id for o in s.ops] == [0, ag.id, 1]
    assert {(e.src, e.dst) for e in s.edges} == {(0, ag.id), (ag.id, 1)}
    assert s.op(1).inputs[0].id == ag.outputs[0].id


# ---------------------------------------------------------------- errors
def test_bad_tp_is_a_clear_error() -> None:
    g = decode("llama-3.1-70b")
    with pytest.raises(TensorParallelError) as err:
        shard_tensor_parallel(g, 3)
    msg = str(err.value)
    assert isinstance(err.value, OpgraphError) and "heads=64" in msg and "tp=3" in msg and msg.startswith("op ")
    assert "\n" not in msg
    for bad in (0, -2):
        with pytest.raises(TensorParallelError, match="tp must be 1 or more"):
            shard_tensor_parallel(g, bad)


def test_non_divisible_gemm_names_op_and_dimension() -> None:
    x = TensorSpec(shape=(4, 96), dtype=DType.bf16, id=0)
    w = TensorSpec(shape=(96, 64), dtype=DType.bf16, id=1)
    y = TensorSpec(shape=(4, 64), dtype=DType.bf16, id=2)
    g = OpGraph(ops=(Gemm(id=7, m=4, n=64, k=96, inputs=(x, w), outputs=(y,), scope="mlp.down_proj"),))
    with pytest.raises(
        TensorParallelError, match=r"op 7: mlp\.down_proj \(gemm\): k \(input features\)=96 is not divisible by tp=64"
    ):
        shard_tensor_parallel(g, 64)


def test_refuses_graphs_that_already_have_collectives() -> None:
    s = shard_tensor_parallel(decode("llama-3.1-70b"), 2)
    with pytest.raises(TensorParallelError, match="already sharded"):
        shard_tensor_parallel(s, 2)
    no_meta = s.model_copy(update={"metadata": s.metadata.model_copy(update={"capture": {}})})
    with pytest.raises(TensorParallelError, match="collective"):
        shard_tensor_parallel(no_meta, 2)


def test_vocab_padding_is_noted_not_refused() -> None:
    g = decode("mixtral-8x7b")  # vocab 32000
    s = shard_tensor_parallel(g, 8)  # 32000 / 8 is fine; 3 would not be, 6 neither
    head = next(o for o in s.ops if o.scope == "lm_head")
    assert isinstance(head, Gemm) and head.n == 32000 // 8
    x = TensorSpec(shape=(2, 16), dtype=DType.bf16, id=0)
    w = TensorSpec(shape=(16, 1001), dtype=DType.bf16, id=1)
    y = TensorSpec(shape=(2, 1001), dtype=DType.bf16, id=2)
    small = OpGraph(ops=(Gemm(id=0, m=2, n=1001, k=16, inputs=(x, w), outputs=(y,), scope="lm_head"),))
    out = shard_tensor_parallel(small, 2)
    gemm = out.op(0)
    assert isinstance(gemm, Gemm) and gemm.n == math.ceil(1001 / 2)
    assert any("padded to 1002" in a for a in out.metadata.assumptions)


# ---------------------------------------------------------------- per-kind handlers
def test_a_users_op_class_is_sharded_by_its_registered_handler() -> None:
    from opgraph.ir import Other
    from opgraph.transforms import register_handler
    from opgraph.transforms.tensor_parallel.sharder import Sharder

    class Scaled(Other):
        """A user's op on the hidden features."""

    seen: list[int] = []

    @register_handler(Scaled)
    def shard_scaled(sh: Sharder, op: Scaled, inputs: list[TensorSpec]) -> OpBase:
        seen.append(op.id)
        return sh.replicated(op, inputs)

    x = TensorSpec(shape=(4, 64), dtype=DType.bf16, id=0)
    w = TensorSpec(shape=(64, 128), dtype=DType.bf16, id=1)
    h = TensorSpec(shape=(4, 128), dtype=DType.bf16, id=2)
    up = Gemm(id=0, m=4, n=128, k=64, inputs=(x, w), outputs=(h,), scope="mlp.up_proj")
    out = TensorSpec(shape=(4, 128), dtype=DType.bf16, id=3)
    g = OpGraph(ops=(up, Scaled(id=1, fn="scaled", inputs=(h,), outputs=(out,)), Other(id=2, fn="plain", inputs=(h,))))
    s = shard_tensor_parallel(g, 2)
    assert seen == [1]  # the subclass reached its handler, the plain Other op did not
    assert [c.collective for c in collectives(s)] == [CollectiveKind.ALL_GATHER]
    with pytest.raises(OpgraphError, match="Scaled ops already have the sharding handler shard_scaled"):
        register_handler(Scaled)(shard_scaled)
