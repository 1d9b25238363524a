"""Served workloads of a real model: op-graph step costs for :mod:`simulators.serving`.

One prefill and one decode graph of the model are captured on meta at the template sizes of
:mod:`opgraph.transforms.rebatch` (others where a model's own sizes clash with them, or its experts
need more tokens to each get their own GEMMs); each bucketed step shape the scheduler meets becomes a graph
(:func:`step_graph`: the decode template rebatched for pure decode steps, the prefill template for
uniform prefills, :func:`~opgraph.transforms.mixed_step` for ragged or mixed steps; a model's sliding
layers read the decodes' mean capped keys its key names for their window), is sharded for
``tp`` ranks like ``opgraph simulate`` does, and is simulated once by :func:`opgraph.study.run_study`
with the user's hardware, cost model and simulation settings. Used by ``opgraph serve-sim`` and by
scenarios with a ``[serving]`` section.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from opgraph.ir import OpGraph, OpgraphError
from opgraph.scenario.model import SERVING_METRICS, ServingSection

if TYPE_CHECKING:
    from hardware import CostModel, HardwareSpec
    from opgraph.capture.api import Recorded
    from opgraph.scenario.context import RunContext
    from opgraph.scenario.resolve import Resolved
    from opgraph.scenario.result import ExpectationResult
    from simulators import SimulationConfig
    from simulators.serving import GraphStepCosts, KvCacheSpec, Request, ServingResult, StepKey

__all__ = [
    "KvShape",
    "ServingModel",
    "StepGraphs",
    "capture_serving_model",
    "check_serving",
    "context_window",
    "run_serving_section",
    "serving_costs",
    "simulate_serving",
    "step_graph",
]


class KvShape(TypedDict):
    """What the KV cache holds per token, named as :meth:`simulators.serving.KvCacheSpec.from_model` takes it."""

    layers: int
    """Layers with a KV cache."""
    kv_heads: int
    """Key/value heads (MLA: one)."""
    head_dim: int
    """Per-token K plus V width per head / 2 (MLA: the latent width / 2 with one 'head')."""
    dtype_bytes: float
    """Bytes of one cached element."""


@dataclass(frozen=True)
class ServingModel:
    """The two captured templates of a model and what its KV cache and weights take."""

    name: str
    prefill: OpGraph
    decode: OpGraph
    weights_bytes: int
    kv: KvShape
    max_positions: int | None = None
    """The model's context window (``max_position_embeddings``): longer requests are dropped."""

    @property
    def windows(self) -> tuple[int, ...]:
        """The sliding windows of the model's layers that both templates know (``()``: none), ascending."""
        from opgraph.transforms import template_windows

        return tuple(sorted(set(template_windows(self.prefill)) & set(template_windows(self.decode))))

    def kv_spec(self, hardware: HardwareSpec, tp: int = 1, utilisation: float = 0.9) -> KvCacheSpec:
        """KV bytes per token and capacity on ``hardware`` with ``tp`` ranks."""
        from simulators.serving import KvCacheSpec

        return KvCacheSpec.from_model(
            **self.kv,
            tp=tp,
            memory_bytes=hardware.memory_bytes,
            weights_bytes=self.weights_bytes,
            utilisation=utilisation,
        )


def _kv_shape(config: Any, layers: int | None, dtype_bytes: float) -> KvShape:
    n_layers = layers or int(getattr(config, "num_hidden_layers", 1))
    rank = getattr(config, "kv_lora_rank", None)
    if rank:  # MLA caches one latent vector (plus the rope part) per token and layer
        width = int(rank) + int(getattr(config, "qk_rope_head_dim", 0) or 0)
        return KvShape(layers=n_layers, kv_heads=1, head_dim=max(1, width // 2), dtype_bytes=dtype_bytes)
    heads = int(getattr(config, "num_attention_heads", 1))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return KvShape(layers=n_layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes)


def _capture_template(model: str, phase: str, dtype: str, layers: int | None) -> Recorded:
    """A ``phase`` template of ``model`` that rebatches to every shape: captured at the default template
    sizes, or again at sizes picked from the refused one (its model sizes clash with them, or its experts
    calls need more tokens to reach every expert)."""
    from opgraph.capture.api import record
    from opgraph.capture.phase import CaptureOptions
    from opgraph.transforms import RebatchError, check_template, template_shape

    rec = record(model, CaptureOptions(phase=phase, dtype=dtype, layers=layers, **template_shape(phase)))
    try:
        check_template(rec.graph)
    except RebatchError:
        sizes = template_shape(phase, refused=rec.graph)
        rec = record(model, CaptureOptions(phase=phase, dtype=dtype, layers=layers, **sizes))
        check_template(rec.graph)
    return rec


def capture_serving_model(model: str, *, dtype: str = "bf16", layers: int | None = None) -> ServingModel:
    """Capture the prefill and decode templates of ``model`` on meta (no weights), at sizes that
    :func:`opgraph.transforms.check_template` accepts."""
    from opgraph.ir.dtypes import DType

    pre = _capture_template(model, "prefill", dtype, layers)
    dec = _capture_template(model, "decode", dtype, layers)
    params = sum(int(p.numel()) for p in pre.prepared.model.parameters())
    itemsize = DType(dtype).itemsize
    return ServingModel(
        name=pre.prepared.name,
        prefill=pre.graph,
        decode=dec.graph,
        weights_bytes=int(params * itemsize),
        kv=_kv_shape(pre.prepared.config, layers, itemsize),
        max_positions=_context_window(pre.prepared.config),
    )


def _context_window(config: Any) -> int | None:
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def context_window(model: str, layers: int | None = None) -> int | None:
    """The context window of ``model`` (a preset, config or folder) from its config, without capturing it:
    what a served request's prompt plus output may not exceed (``None``: the config names none)."""
    from opgraph.capture.sources import build_config, resolve

    return _context_window(build_config(resolve(model), layers=layers))


class StepGraphs:
    """Builds step graphs of one model, reusing what bucketed keys share.

    Decode steps of one batch size share every op but attention and the KV-cache writes: the first
    decode graph of a batch size is kept and later ones rewrite only those (``rebatch(like=...)``);
    mixed steps of one token count share their token-wise ops likewise. The graphs are only
    simulated, so layers share their rewritten tensors (``tensor_ids=False``).
    """

    def __init__(self, templates: ServingModel, tp: int = 1) -> None:
        self.templates = templates
        self.tp = tp
        self._decode_like: dict[int, OpGraph] = {}
        self._token_base: dict[int, OpGraph] = {}

    def graph(self, key: StepKey) -> OpGraph:
        """The op graph of one bucketed step (one rank of it when ``tp > 1``)."""
        from opgraph.study import shard_for_tp
        from opgraph.transforms import AttentionPart, mixed_step, rebatch

        t = self.templates
        if not key.prefill:
            like = self._decode_like.get(key.decode_batch)
            graph = rebatch(
                t.decode,
                batch=key.decode_batch,
                kv_len=key.decode_kv,
                window_kv=key.window_kv,
                like=like,
                tensor_ids=False,
            )
            self._decode_like.setdefault(key.decode_batch, graph)
        elif not key.decode_batch and len(key.prefill) == 1 and key.prefill[0].q_len == key.prefill[0].kv_len:
            p = key.prefill[0]
            graph = rebatch(t.prefill, batch=p.batch, q_len=p.q_len, tensor_ids=False)
        else:
            parts = [AttentionPart(p.batch, p.q_len, p.kv_len) for p in key.prefill]
            dec = AttentionPart(key.decode_batch, 1, key.decode_kv) if key.decode_batch else None
            base = self._token_base.get(key.tokens)
            if base is None:
                base = rebatch(t.prefill, batch=1, q_len=key.tokens, tensor_ids=False, masks=False)
                self._token_base[key.tokens] = base
            graph = mixed_step(
                t.prefill, t.decode, parts, dec, decode_window_kv=key.window_kv, base=base, tensor_ids=False
            )
        return shard_for_tp(graph, self.tp)[0]


def step_graph(templates: ServingModel, key: StepKey, tp: int = 1) -> OpGraph:
    """The op graph of one bucketed step (one rank of it when ``tp > 1``)."""
    return StepGraphs(templates, tp).graph(key)


def serving_costs(
    templates: ServingModel, hardware: HardwareSpec, cost_model: CostModel, config: SimulationConfig
) -> GraphStepCosts:
    """Memoised step costs: each key's graph simulated once with ``run_study`` (``config.tp`` ranks); the
    keys name the decodes' mean capped keys of each of the model's sliding windows."""
    from opgraph.study import run_study
    from simulators.serving import GraphStepCosts

    def simulate_us(graph: OpGraph) -> float:
        return float(run_study(graph, hardware, cost_model, config, shard=False).result.makespan_us)

    return GraphStepCosts(StepGraphs(templates, config.tp).graph, simulate_us, templates.windows)


def simulate_serving(
    templates: ServingModel,
    requests: Sequence[Request],
    *,
    hardware: HardwareSpec,
    cost_model: CostModel,
    config: SimulationConfig,
    scheduler: str = "continuous",
    max_batch: int = 64,
    token_budget: int = 8192,
    utilisation: float = 0.9,
    cost_model_name: str = "",
) -> ServingResult:
    """Serve ``requests`` on ``hardware``: KV cache from the model, step costs from op-graph simulations."""
    from simulators.serving import ServingSettings, get_scheduler, run_serving

    kv = templates.kv_spec(hardware, config.tp, utilisation)
    sched = get_scheduler(scheduler)
    costs = serving_costs(templates, hardware, cost_model, config)
    settings = ServingSettings(
        model=templates.name,
        hardware=hardware.name,
        cost_model=cost_model_name,
        tp=config.tp,
        scheduler=sched.name,
        max_batch=max_batch,
        token_budget=token_budget,
        kv_bytes_per_token=kv.bytes_per_token,
        kv_capacity_tokens=kv.capacity_tokens,
    )
    result = run_serving(
        requests,
        sched,
        costs,
        max_batch=max_batch,
        token_budget=token_budget,
        kv_capacity_tokens=kv.capacity_tokens,
        kv_bytes_per_token=kv.bytes_per_token,
        settings=settings,
        max_context_tokens=templates.max_positions,
    )
    notes = (
        f"{len(costs.memo)} step shapes simulated in {costs.build_s:.2f} s "
        f"({costs.graph_s:.2f} s building their graphs)",
        f"KV cache: {kv.bytes_per_token} B/token, {kv.capacity_tokens} tokens "
        f"({utilisation:.0%} of {kv.memory_bytes / 1e9:.1f} GB less "
        f"{kv.weights_bytes / 1e9:.1f} GB of weights per rank)",
    )
    return result.model_copy(update={"notes": result.notes + notes})


# ---------------------------------------------------------------- scenarios with a [serving] section
def run_serving_section(ctx: RunContext, resolved: Resolved) -> ServingResult:
    """Serve the scenario's workload; writes ``serving.result.json`` and returns the result."""
    from opgraph.ir.io import save_model
    from opgraph.scenario.phases import simulation_config
    from simulators.serving import LengthDist, load_trace, poisson_workload

    s = ctx.scenario
    section, m = s.serving, s.model
    assert section is not None and m is not None  # checked by the model validator
    try:
        if section.requests is not None:
            requests = load_trace(ctx.path_of(section.requests))
        else:
            ps = section.poisson
            assert ps is not None
            requests = poisson_workload(
                rate=ps.rate,
                num_requests=ps.num_requests,
                prompt_len=LengthDist.parse(ps.prompt_len, "serving.poisson.prompt_len"),
                output_len=LengthDist.parse(ps.output_len, "serving.poisson.output_len"),
                seed=ps.seed,
            )
        templates = capture_serving_model(ctx.maybe_path(m.source, (".json",)), dtype=m.dtype, layers=m.layers)
        result = simulate_serving(
            templates,
            requests,
            hardware=resolved.hardware,
            cost_model=resolved.cost_model,
            config=simulation_config(ctx).with_engines(1),
            scheduler=section.scheduler,
            max_batch=section.max_batch,
            token_budget=section.token_budget,
            utilisation=section.memory_utilisation,
            cost_model_name=s.hardware.cost_model or type(resolved.cost_model).__name__,
        )
    except OpgraphError as exc:
        raise ctx.err(exc, "serving") from None
    save_model(result, ctx.write("serving.result.json"))
    return result


def _formatter(unit: str) -> Callable[[float], str]:
    return lambda v: f"{v:.4g}{unit}"


def check_serving(section: ServingSection, result: ServingResult) -> list[ExpectationResult]:
    """The ``[serving.expect]`` bounds, evaluated on ``result``."""
    from opgraph.scenario.checks import within
    from opgraph.scenario.result import ExpectationResult

    exp, summ = section.expect, result.summary
    out: list[ExpectationResult] = []
    for name in SERVING_METRICS:
        bound = getattr(exp, name)
        if bound is None:
            continue
        if name.endswith("_ms"):
            metric, stat = name[: -len("_ms")].rsplit("_", 1)
            value = float(getattr(getattr(summ, f"{metric}_ms"), stat))
            unit = " ms"
        else:
            value, unit = float(getattr(summ, name)), "/s"
        ok, limit = within(value, bound, _formatter(unit))
        out.append(
            ExpectationResult(
                id=f"serving/{name}",
                phase="serving",
                check=name,
                passed=ok,
                value=value,
                limit=limit,
                message=f"{name} = {value:.4g}{unit}, expected {limit}",
            )
        )
    if exp.dropped is not None:
        ok = summ.dropped <= exp.dropped
        out.append(
            ExpectationResult(
                id="serving/dropped",
                phase="serving",
                check="dropped",
                passed=ok,
                value=summ.dropped,
                limit=f"<= {exp.dropped}",
                message=f"{summ.dropped} requests dropped, expected at most {exp.dropped}"
                + (f" (first: {result.dropped[0].reason})" if result.dropped and not ok else ""),
            )
        )
    return out
