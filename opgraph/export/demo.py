"""A small, deterministic demo: a Llama-like decoder graph and a simulated and a 'measured' timeline of it.

Used by the exporters' tests and benchmark and to draw the screenshot in the README
(``python -m opgraph.export.demo OUT_DIR`` writes a trace, a Gantt PNG and an HTML report; the
screenshot ``docs/report.png`` is ``chromium --headless --hide-scrollbars --window-size=1280,1560
--screenshot=docs/report.png OUT_DIR/demo.html``). The
timings come from the project's roofline cost model on an H100 (``hardware.resolve_cost_model("roofline")``
and ``hardware.load_hardware("h100")``, imported when first needed), scheduled greedily on
``engines`` compute engines in dependency order with a host thread issuing each op; the 'measured'
timeline is the same ops on one stream with seeded noise and launch gaps. It stands in for the
simulator and the trace importer, which live elsewhere.
"""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgraph.export.common import op_kind
from opgraph.ir import (
    Activation,
    Attention,
    Edge,
    Elementwise,
    Embedding,
    Gemm,
    GraphMetadata,
    Norm,
    OpBase,
    OpGraph,
    OpKind,
    Rope,
    Span,
    Stage,
    Timeline,
    TimelineKind,
    TimelineSource,
    topological_order,
)
from opgraph.ir.timeline import Bound, SpanCategory

if TYPE_CHECKING:
    from hardware import CostModel, HardwareSpec

HARDWARE = "h100"
"""Catalog name of the device the demo's ops are costed on."""
DEVICE = "H100-SXM"
"""The device as the demo's timelines name it."""
HOST_US = 4.0  # framework time to issue one op


def demo_graph(layers: int = 4, tokens: int = 512, hidden: int = 2048, heads: int = 16, kv_heads: int = 4) -> OpGraph:
    """A prefill graph of a small Llama-like decoder: embedding, ``layers`` blocks, final norm, LM head."""
    head_dim = hidden // heads
    inter = 4 * hidden
    kv = kv_heads * head_dim
    ops: list[OpBase] = []
    edges: list[Edge] = []

    def add(cls: type[OpBase], deps: tuple[int, ...], scope: str, layer: int | None, **fields: Any) -> int:
        op = cls(id=len(ops), scope=scope, layer=layer, stage=Stage.PREFILL, **fields)
        ops.append(op)
        edges.extend(Edge(src=d, dst=op.id) for d in deps)
        return op.id

    x = add(Embedding, (), "model.embed_tokens", None, tokens=tokens, vocab=32000, hidden=hidden)
    for i in range(layers):
        sc = f"model.layers.{i}"
        n1 = add(Norm, (x,), f"{sc}.input_layernorm", i, rows=tokens, hidden=hidden)
        q = add(Gemm, (n1,), f"{sc}.self_attn.q_proj", i, m=tokens, n=hidden, k=hidden)
        k = add(Gemm, (n1,), f"{sc}.self_attn.k_proj", i, m=tokens, n=kv, k=hidden)
        v = add(Gemm, (n1,), f"{sc}.self_attn.v_proj", i, m=tokens, n=kv, k=hidden)
        rq = add(Rope, (q,), f"{sc}.self_attn", i, tokens=tokens, heads=heads, head_dim=head_dim)
        rk = add(Rope, (k,), f"{sc}.self_attn", i, tokens=tokens, heads=kv_heads, head_dim=head_dim)
        att = add(
            Attention, (rq, rk, v), f"{sc}.self_attn", i,
            batch=1, q_len=tokens, kv_len=tokens, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        )  # fmt: skip
        o = add(Gemm, (att,), f"{sc}.self_attn.o_proj", i, m=tokens, n=hidden, k=hidden)
        r1 = add(Elementwise, (x, o), sc, i, fn="add", numel=tokens * hidden, hidden=hidden)
        n2 = add(Norm, (r1,), f"{sc}.post_attention_layernorm", i, rows=tokens, hidden=hidden)
        gate = add(Gemm, (n2,), f"{sc}.mlp.gate_proj", i, m=tokens, n=inter, k=hidden)
        up = add(Gemm, (n2,), f"{sc}.mlp.up_proj", i, m=tokens, n=inter, k=hidden)
        act = add(Activation, (gate, up), f"{sc}.mlp", i, fn="silu", numel=tokens * inter, hidden=inter, gated=True)
        down = add(Gemm, (act,), f"{sc}.mlp.down_proj", i, m=tokens, n=hidden, k=inter)
        x = add(Elementwise, (r1, down), sc, i, fn="add", numel=tokens * hidden, hidden=hidden)
    final = add(Norm, (x,), "model.norm", None, rows=tokens, hidden=hidden)
    add(Gemm, (final,), "lm_head", None, m=tokens, n=32000, k=hidden)
    meta = GraphMetadata(
        model="demo-llama", architecture="LlamaForCausalLM", num_layers=layers, phase="prefill",
        capture={"batch": 1, "seq_len": tokens, "dtype": "bf16", "device": "meta"},
    )  # fmt: skip
    return OpGraph(metadata=meta, ops=tuple(ops), edges=tuple(edges))


def roofline_us(op: OpBase) -> tuple[float, Bound]:
    """Time of an op in microseconds on :data:`HARDWARE` by the ``roofline`` cost model, and what bounds it."""
    model, hw = _roofline()
    cost = model.estimate(op, hw)
    return cost.seconds * 1e6, Bound(cost.bound.value)


@functools.cache
def _roofline() -> tuple[CostModel, HardwareSpec]:
    from hardware import load_hardware, resolve_cost_model

    return resolve_cost_model("roofline"), load_hardware(HARDWARE)


def _span(op: OpBase, track: str, start: float, dur: float, **extra: object) -> Span:
    return Span(
        name=op.definition, track=track, start_us=start, dur_us=dur, op_id=op.id, kind=OpKind(op_kind(op)),
        layer=op.layer, stage=op.stage, definition=op.definition, **extra,
    )  # fmt: skip


def demo_simulated(graph: OpGraph, engines: int = 2) -> Timeline:
    """A greedy list schedule of ``graph`` on ``engines`` engines, with a host thread issuing ops in order."""
    preds = graph.predecessors()
    finish: dict[int, float] = {}
    free = [0.0] * engines
    host = 0.0
    spans: list[Span] = []
    for op_id in topological_order(graph):
        op = graph.op(op_id)
        dur, bound = roofline_us(op)
        spans.append(_span(op, "host", host, HOST_US, category=SpanCategory.HOST, bound=Bound.HOST))
        host += HOST_US
        ready = max([host, *(finish[p] for p in preds[op_id])])
        eng = min(range(engines), key=lambda i: max(free[i], ready))
        start = max(free[eng], ready)
        finish[op_id] = free[eng] = start + dur
        spans.append(_span(op, f"engine{eng}", start, dur, bound=bound))
    src = TimelineSource(
        kind=TimelineKind.SIMULATED, name="demo-llama roofline", device=DEVICE, graph_model=graph.metadata.model,
        config={"engines": engines, "policy": "earliest-engine", "cost_model": "roofline"},
    )  # fmt: skip
    return Timeline(source=src, spans=tuple(spans))


def demo_measured(graph: OpGraph, seed: int = 0) -> Timeline:
    """The ops of ``graph`` in program order on one CUDA stream, with seeded noise (a stand-in measurement)."""
    rng = random.Random(seed)
    t = 3.0
    spans: list[Span] = []
    for op in graph.ops:
        dur, _ = roofline_us(op)
        factor = {"gemm": 1.25, "attention": 1.6, "norm": 2.2}.get(op_kind(op), 1.8)
        dur = dur * factor * rng.uniform(0.9, 1.1)
        spans.append(_span(op, "stream 7", t, dur, category=op_kind(op)))
        t += dur + rng.uniform(0.5, 3.0)
    src = TimelineSource(
        kind=TimelineKind.MEASURED, name="demo-llama measured", device=DEVICE, trace_file="demo.pt.trace.json.gz"
    )
    return Timeline(source=src, spans=tuple(spans), wall_us=t + 5.0)


def main(argv: list[str] | None = None) -> int:
    """Write ``demo.trace.json.gz``, ``demo.png`` and ``demo.html`` of the demo into the folder given."""
    from opgraph.export import write_gantt, write_html_report, write_perfetto

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else ".")
    graph = demo_graph()
    sim, meas = demo_simulated(graph), demo_measured(graph)
    write_perfetto([sim, meas], out / "demo.trace.json.gz", graph=graph, flows=True)
    write_gantt([sim, meas], out / "demo.png", title="demo-llama prefill 512: simulated vs measured")
    write_html_report(out / "demo.html", timelines=[sim, meas], graph=graph, title="demo-llama prefill 512")
    print(f"wrote {out / 'demo.trace.json.gz'}, {out / 'demo.png'}, {out / 'demo.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
