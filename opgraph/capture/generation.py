"""Generate captures at the cost of a few steps: record the prefill and decode steps 1 and 2, build the
rest from step 2 as a :class:`~opgraph.ir.generation.GenerationPlan`.

Decode steps differ only in what depends on the KV length; every other value is the same, and op ids
and tensor ids advance by a constant per step. :func:`plan_generation` reads that from the two
recorded decode steps (a value changes by the same amount each step, a derived cost is derived again
by its op model, an id advances with its step or stays, as a weight's does), refusing anything else
(:class:`NotLinear`). The plan is then checked against a recording of the last step itself, made on
a cache filled to the last step's length in one unrecorded pass: sizes, shapes, costs and the
step's own edges must equal the plan's. What a plan cannot know is so caught at the end of the
generation (a sliding-window cache that stops growing, rope scaling that switches with the length):
such a capture records every step, as before, and says so in ``metadata.assumptions``.
"""

from __future__ import annotations

from typing import Any

from opgraph.capture.phase import (
    CaptureOptions,
    GreedyLoop,
    PhaseRun,
    PreparedModel,
    _new_cache,
    loop_max_length,
    token_ids,
)
from opgraph.capture.recorder import Recorder
from opgraph.ir.generation import DERIVED_FIELDS, EdgeTemplate, FieldDelta, GenerationPlan, Rederived
from opgraph.ir.graph import Edge, OpGraph
from opgraph.ir.ops import OpBase

BASE_STEP = 2
"""The recorded decode step the plan is built from (step 1 reads the prefill's cache, step 2 a decode
step's, as every later step does)."""
MIN_PLANNED_STEPS = 4
"""Generations of fewer decode steps are recorded whole."""

TEMPLATE_NOTE = (
    "decode steps {first}..{last} were built from recorded step {base} (values that depend on the KV "
    "length advanced per step, costs derived again by each op's model) and checked against a recording "
    "of step {last}"
)
"""``metadata.assumptions`` note of a planned generate graph."""
FALLBACK_NOTE = "every decode step was recorded: the decode steps are not the same step at a growing KV length ({why})"
"""``metadata.assumptions`` note when the check refused a plan."""


class NotLinear(Exception):
    """The decode steps do not repeat with values linear in the step (why, in the message)."""


def _derived(op: OpBase) -> dict[str, object]:
    """The cost fields ``op``'s model derives from its other fields (as its validator fills them)."""
    read, written = op.default_bytes()
    return {
        "flops": max(0, int(op.default_flops())),
        "bytes_read": max(0, int(read)),
        "bytes_written": max(0, int(written)),
        "definition": op.default_definition(),
    }


class _Floors:
    """Where steps 1, 2 and 3 start: op ids and tensor ids."""

    def __init__(self, op1: int, op2: int, op3: int, t1: int, t2: int, t3: int) -> None:
        self.op1, self.op2, self.op3 = op1, op2, op3
        self.t1, self.t2, self.t3 = t1, t2, t3
        if op2 - op1 != op3 - op2:
            raise NotLinear(f"decode steps 1 and 2 have {op2 - op1} and {op3 - op2} ops")
        if t2 - t1 != t3 - t2:
            raise NotLinear(f"decode steps 1 and 2 make {t2 - t1} and {t3 - t2} tensors")

    def tensor(self, v1: int | None, v2: int | None, where: str) -> None:
        """Check that tensor id ``v2`` of step 2 is ``v1`` of step 1 advanced as the plan will advance it."""
        if v1 is None or v2 is None:
            if v1 != v2:
                raise NotLinear(f"{where}: tensor id {v1} vs {v2}")
            return
        ok = (
            (v2 >= self.t2 and v1 == v2 - (self.t3 - self.t2))  # made in its own step
            or (self.t1 <= v2 < self.t2 and v1 < self.t1)  # made the step before (the KV cache)
            or (v2 < self.t1 and v1 == v2)  # a weight, a buffer, the same prefill tensor
        )
        if not ok:
            raise NotLinear(f"{where}: tensor id {v1} in step 1 but {v2} in step 2")

    def op(self, v1: int, v2: int, where: str) -> None:
        """Check that op id ``v2`` (an edge source) is ``v1`` advanced as the plan will advance it."""
        ok = (v2 >= self.op2 and v1 == v2 - (self.op3 - self.op2)) or (self.op1 <= v2 < self.op2 and v1 < self.op1)
        ok = ok or (v2 < self.op1 and v1 == v2)
        if not ok:
            raise NotLinear(f"{where}: op id {v1} in step 1 but {v2} in step 2")


def _walk(
    a: Any, b: Any, path: tuple[str | int, ...], out: list[tuple[tuple[str | int, ...], int]], fl: _Floors
) -> None:
    """Pair the values of two dumps: ints that differ give a delta, tensor ids are checked, the rest must be equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            raise NotLinear(f"{'.'.join(map(str, path))}: fields differ")
        for key in a:
            _walk(a[key], b[key], (*path, key), out, fl)
        return
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            raise NotLinear(f"{'.'.join(map(str, path))}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, (*path, i), out, fl)
        return
    if len(path) == 3 and path[0] in ("inputs", "outputs") and path[2] == "id":
        fl.tensor(a, b, ".".join(map(str, path)))
        return
    if type(a) is int and type(b) is int:
        if a != b:
            out.append((path, b - a))
        return
    if a != b or type(a) is not type(b):
        raise NotLinear(f"{'.'.join(map(str, path))}: {a!r} vs {b!r}")


def plan_generation(
    ops: tuple[OpBase, ...], edges: tuple[Edge, ...], new_tokens: int, tensor_starts: tuple[int, int, int]
) -> GenerationPlan:
    """The plan of steps 3..``new_tokens`` from a recording of steps 0..2; :class:`NotLinear` if none fits.

    ``tensor_starts`` are the recorder's first tensor ids of steps 1, 2 and 3 (its count after step 2).
    """
    by_step: dict[int, list[OpBase]] = {}
    for o in ops:
        by_step.setdefault(o.step if o.step is not None else -1, []).append(o)
    s1, s2 = by_step.get(1, []), by_step.get(BASE_STEP, [])
    if not s1 or not s2 or set(by_step) - {0, 1, 2}:
        raise NotLinear("the recording is not a prefill and decode steps 1 and 2")
    if [o.id for o in ops] != list(range(len(ops))):
        raise NotLinear("op ids are not in program order")
    op1, op2 = s1[0].id, s2[0].id
    fl = _Floors(op1, op2, op2 + len(s2), *tensor_starts)
    deltas: list[FieldDelta] = []
    rederived: list[Rederived] = []
    for j, (a, b) in enumerate(zip(s1, s2, strict=False)):
        if a.kind != b.kind or a.id != op1 + j or b.id != op2 + j:
            raise NotLinear(f"op {j} of the step: {a.kind.value} vs {b.kind.value}")
        da, db = a.model_dump(), b.model_dump()
        for d in (da, db):
            d.pop("id")
            d.pop("step")
        found: list[tuple[tuple[str | int, ...], int]] = []
        dfa, dfb = _derived(a), _derived(b)
        derive = tuple(f for f in DERIVED_FIELDS if da[f] == dfa[f] and db[f] == dfb[f])
        primary = {k: v for k, v in da.items() if k not in DERIVED_FIELDS}
        _walk(primary, {k: v for k, v in db.items() if k not in DERIVED_FIELDS}, (), found, fl)
        varies = any(not (len(p) == 3 and p[2] == "id") for p, _ in found)
        if varies and derive:
            rederived.append(Rederived(op=j, fields=derive))
        kept = [f for f in DERIVED_FIELDS if not (varies and f in derive)]
        _walk({f: da[f] for f in kept}, {f: db[f] for f in kept}, (), found, fl)
        deltas.extend(FieldDelta(op=j, path=p, per_step=d) for p, d in found)
    in1 = [e for e in edges if op1 <= e.dst < op2]
    in2 = [e for e in edges if op2 <= e.dst]
    if len(in1) != len(in2):
        raise NotLinear(f"decode steps 1 and 2 have {len(in1)} and {len(in2)} incoming edges")
    for i, (e1, e2) in enumerate(zip(in1, in2, strict=True)):
        where = f"edge {e2.src}->{e2.dst}"
        if e1.kind != e2.kind or e2.dst - e1.dst != op2 - op1 or e2.src >= e2.dst:
            raise NotLinear(f"{where} (edge {i} of the step) does not repeat")
        fl.op(e1.src, e2.src, where)
        fl.tensor(e1.tensor, e2.tensor, where)
    return GenerationPlan(
        base_step=BASE_STEP,
        first_step=BASE_STEP + 1,
        last_step=new_tokens,
        ops=tuple(s2),
        edges=tuple(EdgeTemplate(src=e.src, dst=e.dst, kind=e.kind.value, tensor=e.tensor) for e in in2),
        op_shift=len(s2),
        op_floor=op1,
        tensor_shift=fl.t3 - fl.t2,
        tensor_floor=fl.t1,
        deltas=tuple(deltas),
        rederived=tuple(rederived),
    )


def _strip(op: OpBase) -> dict[str, Any]:
    """An op's dump without its ids (op, tensors), to compare steps of different recordings."""
    d = op.model_dump()
    d.pop("id")
    for side in ("inputs", "outputs"):
        d[side] = [{k: v for k, v in t.items() if k != "id"} for t in d[side]]
    return d


def check_last_step(plan: GenerationPlan, ops: list[OpBase], edges: list[Edge]) -> None:
    """Compare the plan's last step with a recording of it (``ops``/``edges`` of one step, ids from 0)."""
    step = plan.last_step
    built = plan.step_ops(step)
    if len(built) != len(ops):
        raise NotLinear(f"step {step} has {len(ops)} ops, the plan builds {len(built)}")
    for j, (b, r) in enumerate(zip(built, ops, strict=True)):
        sb, sr = _strip(b), _strip(r)
        if sb != sr:
            diff = sorted(k for k in sb if sb.get(k) != sr.get(k))
            raise NotLinear(f"step {step}, op {j} ({r.definition}): {', '.join(diff)} differ from the plan's")
    first = plan.first_id(step)
    planned = {(s - first, d - first) for s, d, _, _ in plan.step_edges(step) if s >= first}
    recorded = {(e.src, e.dst) for e in edges}
    if planned != recorded:
        raise NotLinear(f"step {step}: the edges within the step differ from the plan's")


def record_last_step(
    prepared: PreparedModel, opts: CaptureOptions, lower: Any, like: Any = None
) -> tuple[list[OpBase], list[Edge]]:
    """Record decode step ``new_tokens`` alone, over a cache holding the tokens before it, and its
    sampler over the tokens generated by then.

    On ``meta`` a cache of plain growing layers like ``like`` (the generation's own cache) is made
    directly at that length; otherwise it is filled by one unrecorded forward pass.
    """
    import torch

    step = opts.new_tokens
    rec = Recorder()
    rec.add_root(prepared.model)
    length = opts.seq_len + step - 1
    cache = _grown_cache(like, prepared.config, length) if opts.device == "meta" else None
    run = PhaseRun(prepared, opts, None, cache if cache is not None else _new_cache(prepared.config))
    with torch.no_grad():
        if cache is None:
            run.forward(token_ids(prepared, opts, opts.batch, length, seed=1), "prefill", 0)
        # The loop's state before the last sampler: the prompt and the ``step`` tokens sampled so far.
        ids = token_ids(prepared, opts, opts.batch, opts.seq_len + step, seed=3)
        run.loop = GreedyLoop(ids, prepared.config, loop_max_length(opts))
        run.rec = rec
        run.forward(token_ids(prepared, opts, opts.batch, 1, seed=2), "decode", step, True)
        run.sample()
    _, ops, edges, _ = lower(rec, prepared.hints)
    return list(ops), list(edges)


def _grown_cache(like: Any, config: Any, length: int) -> Any:
    """A new meta cache whose layers hold ``length`` tokens, when every layer of ``like`` is a plain
    ``DynamicLayer`` (a sliding or static layer would not just grow); ``None`` otherwise."""
    import torch

    try:
        from transformers.cache_utils import DynamicLayer

        layers = like.layers
        if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
            return None
        cache = _new_cache(config)
        for i, layer in enumerate(layers):
            k, v = layer.keys, layer.values
            if k.device.type != "meta":
                return None
            keys = torch.empty((*k.shape[:-2], length, k.shape[-1]), dtype=k.dtype, device="meta")
            values = torch.empty((*v.shape[:-2], length, v.shape[-1]), dtype=v.dtype, device="meta")
            cache.update(keys, values, i)
        if len(cache.layers) != len(layers) or any(type(layer) is not DynamicLayer for layer in cache.layers):
            return None
        return cache
    except (AttributeError, ImportError, TypeError, ValueError, IndexError):
        return None


def planned_graph(graph: OpGraph, plan: GenerationPlan) -> OpGraph:
    """``graph`` (steps 0..2) followed by the planned steps, with the plan's note."""
    note = TEMPLATE_NOTE.format(first=plan.first_step, last=plan.last_step, base=plan.base_step)
    md = graph.metadata.model_copy(update={"assumptions": (*graph.metadata.assumptions, note)})
    return OpGraph.planned(md, tuple(graph.ops), tuple(graph.edges), plan)
