"""Warm activations: which inputs the model just wrote, how they map onto a recipe's tensors, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from replay_helpers import FAST
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import (
    DType,
    Elementwise,
    Embedding,
    GraphMetadata,
    Memory,
    Norm,
    OpBase,
    OpGraph,
    View,
    load_graph,
    save_graph,
)
from tests.ir_builders import T, call, mm, t
from validators import load_results, replay_graph, run_to_run, unique_configs
from validators.configs import OpConfig, config_key
from validators.inputs import match_inputs
from validators.recipes import BuildContext
from validators.replay import Replayer
from validators.timing import summarize

BF16 = DType.bf16
DATA = Path(__file__).resolve().parents[1] / "data" / "h100" / "llama-3.2-1b-l2-prefill256.graph.json.gz"


def flow_graph() -> OpGraph:
    s, h, v, big = 8, 32, 64, 4096
    ops: list[OpBase] = [
        Embedding(id=0, target="aten.embedding.default", tokens=s, vocab=v, hidden=h,
                  inputs=(t(v, h, tid=1), t(1, s, tid=2, dtype=DType.int64)), outputs=(t(1, s, h, tid=3),),
                  call=call(T(0), T(1))),
        Norm(id=1, target="LlamaRMSNorm", rows=s, hidden=h, inputs=(t(1, s, h, tid=3), t(h, tid=4)),
             outputs=(t(1, s, h, tid=5),)),
        View(id=2, target="aten.t.default", inputs=(t(h, h, tid=6),), outputs=(t(h, h, tid=6),)),
        mm(3, s, h, h, tids=(5, 6, 7)),
        mm(4, s, big, h, tids=(7, 8, 9)),  # moves far more bytes than the others
        Elementwise(id=5, target="aten.add.Tensor", fn="add", numel=s * h, hidden=h,
                    inputs=(t(1, s, h, tid=3), t(1, s, h, tid=7)), outputs=(t(1, s, h, tid=10),),
                    call=call(T(0), T(1))),
        # In place into a cache from an earlier forward: the cache stays cold.
        Memory(id=6, target="aten.index_copy_.default", fn="kv_cache_write", numel=s * h,
               inputs=(t(4, s, h, tid=20), t(1, s, h, tid=10)), outputs=(t(4, s, h, tid=20),)),
        Elementwise(id=7, target="aten.mul.Tensor", fn="mul", numel=4 * s * h, hidden=h,
                    inputs=(t(4, s, h, tid=20), t(4, s, h, tid=None)), outputs=(t(4, s, h, tid=21),),
                    call=call(T(0), T(1))),
        # The same norm config again, now on a tensor of no id: the first use decides.
        Norm(id=8, target="LlamaRMSNorm", rows=s, hidden=h, inputs=(t(1, s, h, tid=None), t(h, tid=4)),
             outputs=(t(1, s, h, tid=22),)),
    ]  # fmt: skip
    return OpGraph(metadata=GraphMetadata(model="flow", phase="prefill"), ops=tuple(ops))


def by_op(configs: list[OpConfig]) -> dict[int, OpConfig]:
    return {i: c for c in configs for i in c.op_ids}


def test_activations_are_what_an_earlier_op_wrote() -> None:
    cfgs = by_op(unique_configs(flow_graph(), include_views=True))
    assert cfgs[0].warm_inputs == ()  # table and token ids come from outside the graph
    assert cfgs[1].warm_inputs == (0,)  # the norm's input, not its weight
    assert cfgs[1] is cfgs[8] and cfgs[1].count == 2
    assert cfgs[2].warm_inputs == ()  # a view of a weight is a weight
    assert cfgs[3].warm_inputs == (0,) and cfgs[4].warm_inputs == (0,)
    assert cfgs[5].warm_inputs == (0, 1)
    assert cfgs[6].warm_inputs == (1,)
    assert cfgs[7].warm_inputs == ()  # the cache after a write into it; the no-id input
    # Reuse distance: the residual (written by the embedding) is read after the norm and both GEMMs;
    # the first GEMM's output only after the second GEMM; the norm reads what the op before wrote.
    add = cfgs[5]
    assert add.warm_reuse_bytes[0] > add.warm_reuse_bytes[1] > 0
    assert cfgs[1].warm_reuse_bytes == (0,)
    assert add.warm_reuse_bytes[0] - add.warm_reuse_bytes[1] == sum(
        op.total_bytes for op in flow_graph().ops if op.id in (1, 3)
    )


def test_bytes_the_op_before_wrote() -> None:
    g = flow_graph()
    cfgs = by_op(unique_configs(g, include_views=True))
    written = {o.id: sum(t.nbytes for t in o.outputs) for o in g.ops}
    assert cfgs[0].prev_write_bytes == 0  # the first op
    assert cfgs[1].prev_write_bytes == written[0]
    assert cfgs[3].prev_write_bytes == written[1]  # the view between writes nothing
    assert cfgs[4].prev_write_bytes == 0 < written[3]  # a GEMM leaves its output clean (written through)
    assert cfgs[5].prev_write_bytes == 0
    assert cfgs[6].prev_write_bytes == written[5] > 0  # an add leaves it dirty
    assert cfgs[8].prev_write_bytes == written[0]  # the first use decides


def test_real_graph_activations() -> None:
    if not DATA.exists():
        pytest.skip(f"{DATA} not found")
    g = load_graph(DATA)
    cfgs = by_op(unique_configs(g))
    first = {op.kind.value: op.id for op in reversed(g.ops)}  # first op of each kind
    assert cfgs[first["embedding"]].warm_inputs == ()
    assert cfgs[first["norm"]].warm_inputs == (0,)
    assert cfgs[first["gemm"]].warm_inputs == (1,)  # rotary: inv_freq (a buffer) @ positions (just computed)
    # Every linear reads an activation and a weight.
    linears = [c for c in cfgs.values() if c.op.target == "aten.mm.default"]
    assert linears and all(c.warm_inputs == (0,) for c in linears)
    caches = [c for c in cfgs.values() if c.op.target == "aten.cat.default" and c.op.inputs[0].shape == (0,)]
    assert caches and all(c.warm_inputs == (1,) for c in caches)


def test_match_inputs_by_shape_then_size() -> None:
    bf = torch.bfloat16
    q, cos, sin = (
        torch.zeros(1, 4, 8, 16, dtype=bf),
        torch.zeros(1, 1, 8, 16, dtype=bf),
        torch.ones(1, 1, 8, 16, dtype=bf),
    )
    specs = (t(1, 4, 8, 16, tid=1), t(1, 1, 8, 16, tid=2), t(1, 1, 8, 16, tid=3))
    assert match_inputs((cos, sin, q), specs) == [2, 0, 1]  # rope builds cos and sin first
    x2d = torch.zeros(8, 32, dtype=torch.bfloat16)
    w = torch.zeros(64, 32, dtype=torch.bfloat16)
    lin = (t(1, 8, 32, tid=1), t(32, 64, tid=2, strides=(1, 32)))
    assert match_inputs((x2d, w, None), lin) == [0, 1]  # a 2-D input for a recorded 3-D one
    assert match_inputs((x2d, 3, w), lin[:1]) == [0]
    assert match_inputs((w,), (t(1, 8, 32, tid=1, dtype=DType.fp32),)) == [None]
    a, b = torch.zeros(4, 4), torch.zeros(4, 4)
    assert match_inputs((a, b), (t(4, 4, tid=1, dtype=DType.fp32),) * 2) == [0, 1]


def test_replayer_picks_the_warm_tensors_of_a_case() -> None:
    g = flow_graph()
    cfgs = by_op(unique_configs(g))
    rep = Replayer("cpu", FAST)
    try:
        add = cfgs[5]
        recipe = rep.selector.select(add.op).recipe
        assert recipe is not None
        case = recipe.build(add.op, BuildContext(rep.device, torch.Generator().manual_seed(0)))
        idx, tensors = rep.warm_tensors(case, add, l2_bytes=50 * 2**20)
        assert idx == (0, 1) and tensors[0] is case.inputs[0] and tensors[1] is case.inputs[1]
        # An L2 whose usable share holds the fresh input but not the residual (reuse distance + size).
        fresh = add.warm_reuse_bytes[1] + add.op.inputs[1].nbytes
        old = add.warm_reuse_bytes[0] + add.op.inputs[0].nbytes
        assert fresh < old
        idx, tensors = rep.warm_tensors(case, add, l2_bytes=int(old / rep.options.warm_l2_fraction) - 1)
        assert idx == (1,) and len(tensors) == 1 and tensors[0] is case.inputs[1]
        idx, _ = rep.warm_tensors(case, add, l2_bytes=int(fresh / rep.options.warm_l2_fraction) - 1)
        assert idx == ()
    finally:
        rep.close()


def test_cpu_replay_is_unchanged_by_the_gpu_fields() -> None:
    results = list(replay_graph(flow_graph(), "cpu", FAST))
    timed = [r for r in results if r.timing is not None]
    assert timed
    for r in timed:
        assert r.timing is not None
        assert r.timing.timer == "perf_counter" and r.timing.warm_inputs is None and r.timing.sm_clock_mhz is None
        assert r.timing.attribution is None


def test_cli_warm_and_session_flags(tmp_path: Path) -> None:
    graph = save_graph(flow_graph(), tmp_path / "flow.json")
    out = tmp_path / "r.jsonl"
    fast = ["--warmup-ms", "0.5", "--min-samples", "3", "--max-samples", "5", "--max-time", "0.02"]
    flags = ["--cold-l2", "--cold-activations", "--sessions", "3", "--max-sessions", "4", "-q"]
    args = ["replay", str(graph), "-o", str(out), *fast, *flags]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert load_results(out)
    assert "--warm-activations" in CliRunner().invoke(app, ["replay", "--help"]).output


def test_run_to_run_reports_clocks() -> None:
    from validators.results import ReplayResult, ReplayStatus

    op = flow_graph().ops[1]

    def res(key: str, median: float, clock: float | None) -> ReplayResult:
        timing = summarize([median] * 3, sm_clock_mhz=clock, warm_inputs=(0,), attribution="range")
        return ReplayResult(
            key=key, definition=f"d_{key}", kind=op.kind, dtype="bf16", op=op, status=ReplayStatus.OK,
            device="cuda:0", timing=timing,
        )  # fmt: skip

    a = [res("x", 100.0, 1980.0), res("y", 50.0, 1980.0)]
    b = [res("x", 106.0, 1860.0), res("y", 50.0, 1980.0)]
    rr = run_to_run(a, b)
    assert rr.worst == "d_x" and rr.worst_clocks_mhz == (1980.0, 1860.0)
    assert rr.clock_median_rel == pytest.approx((120 / 1920) / 2)
    assert "1980 vs 1860 MHz" in rr.line()
    # Round trip through JSON keeps the new fields; results without them still compare.
    back = ReplayResult.model_validate_json(a[0].model_dump_json())
    assert back.timing is not None and back.timing.warm_inputs == (0,) and back.timing.sm_clock_mhz == 1980.0
    plain = [r.model_copy(update={"timing": summarize([100.0] * 3)}) for r in a[:1]]
    assert run_to_run(plain, b).clock_median_rel is None


def test_replay_op_takes_warm_inputs() -> None:
    from validators import replay_op

    op = flow_graph().ops[1]
    r = replay_op(op, "cpu", FAST, warm_inputs=(0,))
    assert r.status.value == "ok" and r.key == config_key(op)
