"""Expert parallelism over transformers' ``batched_mm`` experts: one ``bmm`` per projection over the
token-expert pairs, each pair against its own gathered weight copy, split by the pairs each rank's
experts receive (``shard_tensor_parallel(..., expert_parallel=True)``)."""

from __future__ import annotations

import json
import math
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opgraph.ir import (
    Collective,
    CollectiveKind,
    EdgeKind,
    ExpertsImpl,
    Gemm,
    Memory,
    MoeRouting,
    OpBase,
    OpGraph,
    save_graph,
)
from opgraph.transforms import shard_tensor_parallel

HIDDEN, INTER = 64, 48
"""Tiny expert sizes, all distinct from the model's other sizes (gate_up is 96 x 64, down 64 x 48)."""
ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
EXPERTS, TOP_K = 4, 2


@cache
def batched_mm_graph(model_type: str, seq_len: int, hidden: int = HIDDEN, inter: int = INTER) -> OpGraph:
    """A 2-layer prefill of ``seq_len`` tokens of a tiny Qwen3-MoE or Mixtral whose 4 experts (2 per
    token) run ``batched_mm``, captured on meta once per session."""
    pytest.importorskip("transformers")
    from opgraph.capture import capture

    if model_type == "qwen3_moe":
        experts = {"num_experts": EXPERTS, "moe_intermediate_size": inter, "intermediate_size": 3 * inter}
    else:
        experts = {"num_local_experts": EXPERTS, "intermediate_size": inter}
    cfg: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 128,
        "max_position_embeddings": 256,
        **experts,
        "num_experts_per_tok": TOP_K,
        "model_type": model_type,
        "architectures": [ARCHITECTURES[model_type]],
        "experts_implementation": "batched_mm",
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{model_type}.json"
        path.write_text(json.dumps(cfg))
        return capture(str(path), device="meta", seq_len=seq_len)


def expert_gemms(graph: OpGraph) -> list[Gemm]:
    """The ``batched_mm`` expert GEMMs, by their typed ``expert`` field."""
    return [
        o for o in graph.ops if isinstance(o, Gemm) and o.expert is not None and o.expert.impl is ExpertsImpl.BATCHED_MM
    ]


def writer(graph: OpGraph, tensor: int | None) -> OpBase:
    (op,) = [o for o in graph.ops if any(t.id == tensor for t in o.outputs)]
    return op


def weight_gather(graph: OpGraph, gemm: Gemm) -> Memory:
    """The gather of the weight copies ``gemm`` reads (the ``index`` of the stacked expert weights)."""
    (gather,) = [w for w in (writer(graph, t.id) for t in gemm.inputs) if isinstance(w, Memory)]
    return gather


def collectives(graph: OpGraph, kind: CollectiveKind) -> list[Collective]:
    return [o for o in graph.ops if isinstance(o, Collective) and o.collective is kind]


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tp", [2, 4])
def test_expert_parallel_splits_the_token_expert_pairs(model_type: str, tp: int) -> None:
    """12 tokens routed to 2 of 4 experts each: 24 pairs, 24 / tp on each rank, each pair against a
    copy of its expert's whole weights (n and k whole, unlike the split inside the experts)."""
    seq_len = 12
    pairs = seq_len * TOP_K  # what the model routes, counted from its config
    g = batched_mm_graph(model_type, seq_len)
    s = shard_tensor_parallel(g, tp, expert_parallel=True)
    s.lint()
    gemms = expert_gemms(g)
    assert len(gemms) == 4  # gate_up and down of 2 layers
    for old in gemms:
        new = s.op(old.id)
        assert isinstance(new, Gemm) and new.expert == old.expert
        assert old.batch == pairs and (old.m, old.groups) == (1, 1)
        assert (new.batch, new.m, new.n, new.k) == (pairs // tp, 1, old.n, old.k)
        assert new.flops == 2 * (pairs // tp) * old.n * old.k and new.flops * tp == old.flops
        assert new.definition == f"{old.definition}_ep{tp}"
        # Each rank gathers copies of its own experts' weights for its own pairs only.
        old_gather, new_gather = weight_gather(g, old), weight_gather(s, new)
        assert new_gather.id == old_gather.id
        copy_bytes = pairs * old.n * old.k * old.inputs[0].dtype.itemsize
        assert old_gather.bytes_written == copy_bytes and new_gather.bytes_written * tp == copy_bytes
        assert new_gather.outputs[0].shape[0] == pairs // tp and new_gather.numel * tp == old_gather.numel
        assert new_gather.inputs[0].shape[0] == EXPERTS // tp  # the stacked weights of the rank's experts
        # Every operand and result sized by the pairs holds the rank's pairs.
        for t in (*new.inputs, *new.outputs):
            assert t.shape[0] == pairs // tp
    # Summed over the ranks, the experts do the unsharded graph's work.
    assert sum(o.flops for o in expert_gemms(s)) * tp == sum(o.flops for o in gemms)
    # No collective rebuilds the pairs: the only all-gather is the logits'; one all-reduce of each
    # combine's partial sum, as for grouped experts.
    gathered = {c.inputs[0].shape for c in collectives(s, CollectiveKind.ALL_GATHER)}
    assert gathered <= {o.outputs[0].shape for o in s.ops if o.scope.endswith("lm_head")}
    combines = [o for o in s.ops if isinstance(o, MoeRouting) and o.fn == "combine"]
    assert len(combines) == 2
    for comb in combines:
        after = [s.op(e.dst) for e in s.edges if e.src == comb.id and e.kind is EdgeKind.DATA]
        (ar,) = [o for o in after if isinstance(o, Collective)]
        assert ar.collective is CollectiveKind.ALL_REDUCE and ar.bytes == comb.outputs[0].nbytes
        assert all(t.shape[0] == pairs // tp for t in comb.inputs)  # the rank's pairs, summed
    assumptions = " ".join(s.metadata.assumptions)
    assert "token-expert pairs / tp" in assumptions and "ceil(pairs / tp)" in assumptions


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tp", [2, 4])
def test_without_expert_parallel_the_experts_split_inside(model_type: str, tp: int) -> None:
    """The old behaviour: every rank keeps all pairs, with n / tp of gate_up and k / tp of down."""
    g = batched_mm_graph(model_type, 12)
    s = shard_tensor_parallel(g, tp)
    for old in expert_gemms(g):
        new = s.op(old.id)
        assert isinstance(new, Gemm) and new.batch == old.batch == 24
        gate_up = old.n == 2 * INTER
        assert (new.n * tp, new.k) == (old.n, old.k) if gate_up else (new.n, new.k * tp) == (old.n, old.k)
        assert new.flops * tp == old.flops and not new.definition.endswith(f"_ep{tp}")
        assert weight_gather(s, new).outputs[0].shape[0] == old.batch
    assert "experts split inside" in " ".join(s.metadata.assumptions)


def test_edges_keep_their_sizes_under_expert_parallelism() -> None:
    """A tensor keeps one size along every data edge where the capture had one, except where a rank
    reads its own pairs of a whole tensor that every rank holds (the dispatched tokens, the routing
    weights): a local slice, its producer unchanged."""
    g, tp = batched_mm_graph("qwen3_moe", 12), 4
    s = shard_tensor_parallel(g, tp, expert_parallel=True)
    old_by_id = {o.id: o for o in g.ops}

    def numel(graph: OpGraph, op_id: int, tensor: int, out: bool) -> int | None:
        op = graph.op(op_id)
        return next((t.numel for t in (op.outputs if out else op.inputs) if t.id == tensor), None)

    sliced = 0
    for e in s.edges:
        if e.tensor is None or e.kind is not EdgeKind.DATA:
            continue
        a, b = numel(s, e.src, e.tensor, True), numel(s, e.dst, e.tensor, False)
        if a == b:
            continue
        assert e.src in old_by_id and e.dst in old_by_id
        if numel(g, e.src, e.tensor, True) != numel(g, e.dst, e.tensor, False):
            continue  # sizes the capture itself did not keep
        assert s.op(e.src) == g.op(e.src) and a == (b or 0) * tp, (e, a, b)
        sliced += 1
    assert sliced >= 2 * 2  # per layer: the dispatched tokens into gate_up, the routing weights into combine


def test_pairs_tp_does_not_divide_are_the_busiest_ranks() -> None:
    """5 tokens picking 2 experts: 10 pairs over 4 ranks; every rank is modelled as the busiest, with
    ceil(10 / 4) = 3 pairs (as grouped experts run ceil(groups / tp) groups)."""
    g, tp = batched_mm_graph("mixtral", 5), 4
    s = shard_tensor_parallel(g, tp, expert_parallel=True)
    s.lint()
    for old in expert_gemms(g):
        new = s.op(old.id)
        assert isinstance(new, Gemm) and (old.batch, new.batch) == (10, 3)
        assert new.flops == 2 * 3 * old.n * old.k
        assert weight_gather(s, new).outputs[0].shape[0] == 3


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_type=st.sampled_from(sorted(ARCHITECTURES)),
    seq_len=st.integers(1, 9),
    tp=st.sampled_from((2, 4)),
)
def test_expert_parallel_invariants(model_type: str, seq_len: int, tp: int) -> None:
    """Any token count: each rank multiplies the fewest pairs that cover all of them over tp ranks,
    its expert work at least 1 / tp of the whole and at most that plus one pair's."""
    g = batched_mm_graph(model_type, seq_len)
    s = shard_tensor_parallel(g, tp, expert_parallel=True)
    s.lint()
    for old in expert_gemms(g):
        new = s.op(old.id)
        assert isinstance(new, Gemm)
        assert new.batch == math.ceil(old.batch / tp)
        assert new.batch * tp >= old.batch > (new.batch - 1) * tp
        one_pair = 2 * old.n * old.k
        assert old.flops <= new.flops * tp and new.flops <= old.flops / tp + one_pair
        gather = weight_gather(s, new)
        assert gather.outputs[0].shape[0] == new.batch
    assert all(tp % c.group_size == 0 for c in s.ops if isinstance(c, Collective))


# ---------------------------------------------------------------- the simulate CLI
def test_simulate_cli_splits_the_experts_with_expert_parallel(tmp_path: Path) -> None:
    """``opgraph simulate GRAPH --tp N --expert-parallel`` shards the captured graph with expert
    parallelism, and each rank's expert time (the weight-copy gathers and the bmms, which move gigabytes
    of weight copies at this size) drops with the pairs, by about N; a graph sharded in Python first
    (it has its collectives) runs the same as one rank."""
    from typer.testing import CliRunner

    from opgraph.cli.app import app
    from opgraph.ir import load_timeline

    g = batched_mm_graph("qwen3_moe", 256, hidden=1024, inter=512)  # 512 pairs: 1 GB of gate_up copies
    gemm_ids = {o.id for o in expert_gemms(g)}
    expert_ids = gemm_ids | {weight_gather(g, o).id for o in expert_gemms(g)}
    path = tmp_path / "g.json"
    save_graph(g, path)

    def expert_us(graph_path: Path, tp: int, *flags: str) -> dict[int, float]:
        out = tmp_path / f"t{tp}{''.join(flags)}.json"
        args = ["simulate", str(graph_path), "-H", "h100", "-c", "roofline", "--tp", str(tp), "--json", "-o", str(out)]
        r = CliRunner().invoke(app, [*args, *flags])
        assert r.exit_code == 0, r.output
        rank0 = "rank0/" if tp > 1 else ""  # every rank runs the same graph: rank 0 stands for all
        spans = [x for x in load_timeline(out).spans if x.track.startswith(f"{rank0}compute")]
        # The timeline names the split: the bmms of the rank's pairs (by expert, not inside the experts).
        gemm_defs = {x.definition for x in spans if x.op_id in gemm_ids}
        assert gemm_defs and all((d or "").endswith(f"_ep{tp}") == bool(flags or (tp > 1 and "ep" in graph_path.name))
                                 for d in gemm_defs), gemm_defs  # fmt: skip
        return {x.op_id: x.dur_us for x in spans if x.op_id in expert_ids}

    whole = expert_us(path, 1)
    assert len(whole) == len(expert_ids)
    for tp in (2, 4):
        rank = expert_us(path, tp, "--expert-parallel")
        assert sum(whole.values()) / tp * 0.9 < sum(rank.values()) < sum(whole.values()) / tp * 1.1, (tp, rank)
        sharded = tmp_path / f"g_ep{tp}.json"
        save_graph(shard_tensor_parallel(g, tp, expert_parallel=True), sharded)
        assert sum(expert_us(sharded, tp).values()) == pytest.approx(sum(rank.values()), rel=1e-9)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "1"], "needs --tp above 1"),
        (["--tp", "2", "--no-shard"], "needs --tp above 1 and no --no-shard"),
    ],
)
def test_expert_parallel_without_a_split_is_a_one_line_error(tmp_path: Path, args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from opgraph.cli.app import app

    path = tmp_path / "g.json"
    save_graph(batched_mm_graph("qwen3_moe", 8), path)
    r = CliRunner().invoke(app, ["simulate", str(path), "-H", "h100", "-c", "roofline", "--expert-parallel", *args])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--expert-parallel" in lines[0] and message in lines[0], r.output


def test_expert_parallel_on_a_dense_graph_is_a_one_line_error() -> None:
    from typer.testing import CliRunner

    from opgraph.cli.app import app

    path = Path(__file__).resolve().parents[2] / "data" / "h100" / "llama-3.2-1b-l2-prefill256.graph.json.gz"
    r = CliRunner().invoke(
        app, ["simulate", str(path), "-H", "h100", "-c", "roofline", "--tp", "2", "--expert-parallel"]
    )
    assert r.exit_code == 2 and "no MoE expert GEMMs" in r.output and len(r.output.strip().splitlines()) == 1
