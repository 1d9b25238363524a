"""The public API: :func:`capture` a model into an :class:`~opgraph.ir.OpGraph`, and :func:`tracing`
whatever PyTorch runs inside a ``with`` block.

Phases: ``prefill`` (``batch`` x ``seq_len`` new tokens, an empty KV cache), ``decode`` (one token per
sequence over a KV cache of ``kv_len`` tokens, filled beforehand without recording), ``generate``
(a prefill then ``new_tokens`` greedy decode steps, each op tagged with its stage and step).

The model is built directly on the target device from its config (``meta``: no weights, any size;
``cpu``, ``cuda`` or ``cuda:N``: random weights). Mixture-of-experts layers run with modelled routing
(:mod:`opgraph.capture.moe_model`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgraph.capture.generation import MIN_PLANNED_STEPS
from opgraph.capture.hosttime import measure_host_gaps, with_host_gaps
from opgraph.capture.lowering import DEFAULT_PIPELINE, Hints, Lowering, run_passes
from opgraph.capture.lowering.build import build_ops, group_order
from opgraph.capture.phase import (
    AttnImpl,
    CaptureDevice,
    CaptureDType,
    CaptureOptions,
    Phase,
    PhaseRecorder,
    PhaseRun,
    PreparedModel,
    run_phase,
    setup_phase,
    token_ids,
)
from opgraph.capture.recorder import Recorder
from opgraph.capture.sources import CaptureError, ConfigError, ModelSource, build_config, resolve
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.graph import CaptureSettings, GraphMetadata, OpGraph

__all__ = [
    "AttnImpl",
    "CaptureDType",
    "CaptureDevice",
    "CaptureOptions",
    "Phase",
    "PhaseRecorder",
    "PreparedModel",
    "Recorded",
    "Tracing",
    "add_host_timing",
    "capture",
    "graph_from_recording",
    "hints_from_config",
    "layer_windows",
    "lower",
    "prepare",
    "record",
    "record_generation",
    "run_phase",
    "setup_phase",
    "token_ids",
    "tracing",
]


def hints_from_config(config: Any) -> Hints:
    """Head counts, MLA and sliding windows from a transformers config."""
    if config is None:
        return Hints()
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return Hints(
        num_heads=heads,
        num_kv_heads=kv,
        mla=bool(getattr(config, "kv_lora_rank", None)),
        layer_windows=layer_windows(config),
    )


def layer_windows(config: Any) -> dict[int, int]:
    """The sliding window of each layer that has one, as transformers decides it.

    A config with ``layer_types`` names its sliding layers (Gemma 2 and 3, gpt-oss; Qwen2 and Qwen3
    build them from ``use_sliding_window`` and ``max_window_layers``). Without ``layer_types`` a
    ``sliding_window`` applies to every layer: Mistral, Mixtral, Phi-3, Starcoder2 and Qwen3-MoE pick
    ``create_sliding_window_causal_mask`` for all layers when it is set, and transformers' caches keep
    that window in every layer (``cache_utils.get_layer_types_and_kwargs``). Configs that do not use
    the window clear it (Qwen3-MoE without ``use_sliding_window``).

    >>> from types import SimpleNamespace as Config
    >>> layer_windows(Config(sliding_window=4, layer_types=["sliding_attention", "full_attention"]))
    {0: 4}
    >>> layer_windows(Config(sliding_window=4, num_hidden_layers=2))
    {0: 4, 1: 4}
    >>> layer_windows(Config(sliding_window=None, num_hidden_layers=2))
    {}
    """
    window = getattr(config, "sliding_window", None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        return {}
    types = getattr(config, "layer_types", None)
    if isinstance(types, list | tuple):
        return {i: window for i, t in enumerate(types) if "sliding" in str(t)}
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int):
        return {}
    return dict.fromkeys(range(layers), window)


def _check_positions(model: Any, config: Any, opts: CaptureOptions, name: str) -> str | None:
    """Refuse more positions than the model's learned position table holds; past the ``max_position_embeddings``
    of a model without one (rotary or ALiBi positions, computed for any index, as transformers runs them) an
    assumption saying so, for the graph to state. ``None`` within the limit.

    A learned table is an ``nn.Embedding`` beside the token embedding with at least ``limit`` rows (GPT-2's
    ``wpe``; OPT's ``embed_positions`` holds two more): on ``meta`` nothing would fail on an index past it.
    """
    import torch

    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or opts.positions <= limit:
        return None
    what = "--kv-len" if opts.phase == "decode" else "--seq-len"
    tokens = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tables = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m is not tokens and limit <= m.num_embeddings <= limit + 8
    ]
    if tables:
        raise CaptureError(
            f"{opts.positions} positions exceed the model's learned position table ({limit} positions)",
            where=what,
            hint=f"{name} supports at most {limit} positions",
        )
    return (
        f"{opts.positions} positions exceed {name}'s max_position_embeddings ({limit}): captured as transformers "
        "runs them (its positions are computed, not a learned table), past the lengths the model was trained for"
    )


OLDEST_TRANSFORMERS = "5.17"
"""The oldest transformers release opgraph captures models with: the GPU machine's (5.17) to the newest
(5.24) are tested. Older ones run other model code (before 5.4 the meta build itself fails; 5.4 to 5.16
differ in MoE routing steps and generate's stopping) that the capture and the replay recipes do not follow."""


def check_transformers(version: str) -> None:
    """Refuse a transformers release older than :data:`OLDEST_TRANSFORMERS`.

    >>> check_transformers("5.24.0")
    >>> check_transformers("4.51.3")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    opgraph.capture.sources.CaptureError: transformers: version 4.51.3 is older than 5.17, the oldest ...
    """
    from packaging.version import Version

    if Version(version) < Version(OLDEST_TRANSFORMERS):
        raise CaptureError(
            f"version {version} is older than {OLDEST_TRANSFORMERS}, the oldest opgraph captures with",
            where="transformers",
            hint=f"pip install -U 'transformers>={OLDEST_TRANSFORMERS}'",
        )


def prepare(model_or_id: Any, opts: CaptureOptions) -> PreparedModel:
    """Resolve and build the model on ``opts.device`` (or take a given ``nn.Module``); a device that is
    not here (no CUDA, ``cuda:N`` beyond the visible devices) is a :class:`CaptureError` naming ``--device``."""
    import torch

    opts.validate()
    if isinstance(model_or_id, torch.nn.Module):
        model = model_or_id
        config = getattr(model, "config", None)
        name = type(model).__name__
        source = None
        beyond = None
    else:
        import transformers

        check_transformers(transformers.__version__)
        transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        source = resolve(str(model_or_id))
        config = build_config(source, layers=opts.layers, trust_remote_code=opts.trust_remote_code)
        name = source.name
        model, used_impl = _build(config, opts, name, checkpoint(source) if opts.weights else None)
        beyond = _check_positions(model, config, opts, name)
    from opgraph.capture import moe_model

    prepared = PreparedModel(name, model, config, hints_from_config(config), source)
    if beyond:
        prepared.assumptions.append(beyond)
    if not isinstance(model_or_id, torch.nn.Module) and used_impl != opts.attn_impl and has_attention(model):
        prepared.assumptions.append(
            f"{name} has no {opts.attn_impl} attention in this transformers; captured with {used_impl} attention"
        )
    routing = moe_model.install(model, opts.moe_skew, opts.device)
    if routing:
        prepared.assumptions.append(routing)
    elif opts.moe_skew:  # a skew asked for and nothing it applies to: an error, not ignored
        raise CaptureError(
            f"{name} has no MoE experts whose loads it could skew",
            where="--moe-skew",
            hint="leave it out for a dense model",
        )
    return prepared


def has_attention(model: Any) -> bool:
    """True when some submodule is an attention block (state-space models such as Mamba have none)."""
    return any("attention" in type(m).__name__.lower() for m in model.modules())


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
"""Weight files of a checkpoint that ``--weights`` loads (transformers' own names)."""


def checkpoint(source: ModelSource) -> str:
    """The folder of ``source``'s weights for ``--weights``; a :class:`CaptureError` when it has none (a
    preset, a lone config.json, or a folder or cached hub id without weight files)."""
    folder = Path(source.path) if source.path and source.origin in ("folder", "hf-cache") else None
    if folder is None or not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        where = f"{source.name} ({source.origin})"
        raise CaptureError(
            "has no weights to load (no *.safetensors or pytorch_model*.bin beside its config.json)",
            where=where,
            hint="give a model folder or a cached hub id with its weight files, or leave --weights out for "
            "seeded random weights",
        )
    return str(folder)


def _build(config: Any, opts: CaptureOptions, name: str, weights: str | None = None) -> tuple[Any, str]:
    """The model on ``opts.device``: from ``config`` with seeded random weights, or with the checkpoint's
    own weights loaded from the folder ``weights`` (the layers ``config`` keeps)."""
    import torch
    import transformers

    impl = opts.attn_impl
    try:
        for attempt in (impl, "eager"):
            try:
                if weights is not None:
                    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
                        weights,
                        config=config,
                        dtype=opts.torch_dtype,
                        attn_implementation=attempt,
                        trust_remote_code=opts.trust_remote_code,
                    )
                    model.to(torch.device(opts.device))
                    impl = attempt
                    break
                if opts.device != "meta":
                    torch.manual_seed(opts.seed)  # reproducible weights (and routing) for a given seed
                with torch.device(opts.device):
                    model = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                        config,
                        dtype=opts.torch_dtype,
                        attn_implementation=attempt,
                        trust_remote_code=opts.trust_remote_code,
                    )
                impl = attempt
                break
            except ValueError as exc:
                if attempt == "eager" or "does not support an attention implementation" not in str(exc):
                    raise
    except ValueError as exc:
        msg = " ".join(str(exc).split())
        if "Unrecognized configuration class" in msg or "does not support" in msg or "not supported" in msg:
            arch = type(config).__name__
            raise CaptureError(
                f"unsupported architecture: transformers has no causal LM for {arch} ({msg[:160]})",
                where=name,
                hint="capture supports decoder-only models that AutoModelForCausalLM can build",
            ) from None
        raise ConfigError(f"transformers cannot build this model ({msg[:240]})", where=name) from None
    except (RuntimeError, AssertionError) as exc:
        # Only the model's constructor runs in the try: torch refusing a size the config gave (a
        # negative dimension), or a module's own check (nn.Embedding's padding_idx past the vocabulary).
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(
            f"transformers cannot build this model ({msg[:240]})", where=name, hint=_rejection_hint(config, msg)
        ) from None
    model.eval()
    return model, impl


def _rejection_hint(config: Any, msg: str) -> str:
    """What to fix in a config whose model torch or transformers refused to build."""
    pad, vocab = getattr(config, "pad_token_id", None), getattr(config, "vocab_size", None)
    if "padding_idx" in msg.lower() and isinstance(pad, int) and isinstance(vocab, int):
        return f"pad_token_id ({pad}) must be below vocab_size ({vocab})"
    return "check the sizes in the config"


def lower(
    rec: Recorder, hints: Hints | None = None, pipeline: tuple[str, ...] = DEFAULT_PIPELINE
) -> tuple[Lowering, list[Any], list[Any], list[int | None]]:
    """Run the lowering passes over a recording; returns (lowering, ops, edges, op id of each event)."""
    lw = Lowering(rec.events, rec.calls, hints)
    run_passes(lw, pipeline)
    scopes = [c.scope for c in rec.calls]
    ops, edges = build_ops(lw, scopes)
    order = group_order(lw)
    op_of_group = {g: i for i, g in enumerate(order)}
    event_op = [op_of_group.get(o) if o >= 0 else None for o in lw.owner]
    return lw, ops, edges, event_op


def _versions() -> dict[str, str]:
    import torch

    from opgraph import __version__

    out = {"opgraph": __version__, "torch": torch.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


def graph_from_recording(
    rec: Recorder,
    *,
    hints: Hints | None = None,
    model: str = "",
    architecture: str = "",
    config_hash: str = "",
    num_layers: int | None = None,
    phase: str = "trace",
    settings: CaptureSettings | None = None,
    assumptions: list[str] | None = None,
) -> tuple[OpGraph, list[int | None]]:
    """Lower a recording into a graph; also returns the op id of each recorded event."""
    _, ops, edges, event_op = lower(rec, hints)
    notes = list(dict.fromkeys([*(assumptions or []), *rec.assumptions]))
    md = GraphMetadata(
        model=model,
        architecture=architecture,
        config_hash=config_hash,
        num_layers=num_layers,
        phase=phase,
        capture=settings or CaptureSettings(),
        versions=_versions(),
        assumptions=tuple(notes),
    )
    return OpGraph.model_construct(metadata=md, ops=tuple(ops), edges=tuple(edges)), event_op


def _metadata_args(prepared: PreparedModel, opts: CaptureOptions) -> dict[str, Any]:
    cfg = prepared.config
    arch = type(prepared.model).__name__
    settings = CaptureSettings(
        batch=opts.batch,
        dtype=opts.dtype,
        device=opts.device,
        attn_impl=opts.attn_impl,
        seq_len=opts.seq_len if opts.phase in ("prefill", "generate") else None,
        kv_len=opts.kv_len if opts.phase == "decode" else None,
        new_tokens=opts.new_tokens if opts.phase == "generate" else None,
        layers=opts.layers,
        moe_skew=opts.moe_skew,
        seed=opts.seed if opts.device != "meta" and prepared.source is not None and not opts.weights else None,
        weights="checkpoint" if opts.weights else None,
    )
    return {
        "hints": prepared.hints,
        "model": prepared.name,
        "architecture": arch,
        "config_hash": prepared.source.config_hash if prepared.source else "",
        "num_layers": getattr(cfg, "num_hidden_layers", None) if cfg is not None else None,
        "phase": opts.phase,
        "settings": settings,
        "assumptions": prepared.assumptions,
    }


def capture(
    model_or_id: Any,
    phase: str = "prefill",
    batch: int = 1,
    seq_len: int = 512,
    kv_len: int = 2048,
    new_tokens: int = 4,
    dtype: str = "bf16",
    layers: int | None = None,
    attn_impl: str = "sdpa",
    device: str = "meta",
    moe_skew: float | None = None,
    trust_remote_code: bool = False,
    host_timing: bool = False,
    seed: int = 0,
    weights: bool = False,
) -> OpGraph:
    """Capture a causal LM into a typed op graph.

    ``model_or_id`` is a preset key or HF id of a preset, a ``config.json`` path, a model folder, a
    hub id in the local HF cache, or an ``nn.Module`` taking ``input_ids``. For a measured timeline
    as well, use :func:`opgraph.capture.profile_capture`. ``host_timing`` also measures the host
    time the framework spends before each op on this machine (``OpBase.host_gap_us``, see
    :mod:`opgraph.capture.hosttime`). A ``moe_skew`` above 0 on a model without MoE experts is a
    :class:`CaptureError`, not ignored. On a real device the random weights are seeded with ``seed``
    (the same seed gives the same weights and MoE routing); ``weights`` loads the checkpoint's own instead
    (a model folder or cached hub id with weight files); a given ``nn.Module`` keeps its own.

    >>> g = capture("llama-3.2-1b", seq_len=16, layers=1)  # doctest: +SKIP
    >>> g.summary()["by_kind"]["gemm"]["ops"]  # doctest: +SKIP
    8
    """
    opts = CaptureOptions.model_validate(
        {
            "phase": phase,
            "batch": batch,
            "seq_len": seq_len,
            "kv_len": kv_len,
            "new_tokens": new_tokens,
            "dtype": dtype,
            "layers": layers,
            "attn_impl": attn_impl,
            "device": device,
            "moe_skew": moe_skew,
            "trust_remote_code": trust_remote_code,
            "host_timing": host_timing,
            "seed": seed,
            "weights": weights,
        }
    )
    if opts.phase == "generate" and not opts.host_timing and opts.new_tokens >= MIN_PLANNED_STEPS:
        return record_generation(model_or_id, opts)
    rec = record(model_or_id, opts)
    return add_host_timing(rec.graph, rec.recorder, rec.event_op, rec.prepared, opts)


def record_generation(model_or_id: Any, opts: CaptureOptions) -> OpGraph:
    """A generate graph from the prefill and decode steps 1 and 2, the later steps planned
    (:mod:`opgraph.capture.generation`); every step recorded when the plan does not check out."""
    from opgraph.capture import generation as gen

    with paused_gc():
        prepared = prepare(model_or_id, opts)
        rec = Recorder()
        rec.add_root(prepared.model)
        run = PhaseRun(prepared, opts, rec, setup_phase(prepared, opts))
        with _no_grad():
            run.prefill()
            starts: list[int] = []
            for step in (1, gen.BASE_STEP):
                run.sample()
                starts.append(rec.tensor_count)
                run.decode(step)
            run.sample()  # step 2's sampler, which belongs to step 2
            starts.append(rec.tensor_count)
        args = _metadata_args(prepared, opts)
        graph, _ = graph_from_recording(rec, **args)
        try:
            plan = gen.plan_generation(
                tuple(graph.ops), tuple(graph.edges), opts.new_tokens, (starts[0], starts[1], starts[2])
            )
            ops, edges = gen.record_last_step(prepared, opts, lower, run.cache)
            gen.check_last_step(plan, ops, edges)
        except gen.NotLinear as exc:
            with _no_grad():
                for step in range(gen.BASE_STEP + 1, opts.new_tokens + 1):
                    run.decode(step)
                run.sample()  # the last step's sampler
            args["assumptions"] = [*args["assumptions"], gen.FALLBACK_NOTE.format(why=exc)]
            graph, _ = graph_from_recording(rec, **args)
            return graph
    return gen.planned_graph(graph, plan)


def _no_grad() -> Any:
    import torch

    return torch.no_grad()


@dataclass(frozen=True)
class Recorded:
    """A prepared model, its recorded phase and the graph lowered from it."""

    prepared: PreparedModel
    recorder: Recorder
    graph: OpGraph
    event_op: list[int | None]
    """Op id of each recorded event (``None``: folded into no op)."""


def record(model_or_id: Any, opts: CaptureOptions) -> Recorded:
    """Prepare the model, record its phase and lower it (GC paused)."""
    with paused_gc():
        prepared = prepare(model_or_id, opts)
        rec = Recorder()
        rec.add_root(prepared.model)
        run_phase(prepared, opts, rec)
        graph, event_op = graph_from_recording(rec, **_metadata_args(prepared, opts))
    return Recorded(prepared, rec, graph, event_op)


def add_host_timing(
    graph: OpGraph, rec: Recorder, event_op: list[int | None], prepared: PreparedModel, opts: CaptureOptions
) -> OpGraph:
    """The graph with the framework's host time per op when ``opts.host_timing`` asks for it."""
    if not opts.host_timing:
        return graph
    timing = measure_host_gaps(prepared, opts, event_op, [e.target for e in rec.events])
    return with_host_gaps(graph, timing)


class Tracing:
    """Handle returned by :func:`tracing`; ``graph`` is ready after the ``with`` block ends."""

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder = recorder
        self.name = name
        self._graph: OpGraph | None = None
        self.started = time.perf_counter()

    @property
    def graph(self) -> OpGraph:
        """The recorded graph (lowered on first access after the block)."""
        if self._graph is None:
            self._graph, _ = graph_from_recording(self.recorder, model=self.name, phase="trace")
        return self._graph

    def set_stage(self, stage: str | None, step: int | None = None) -> None:
        """Tag what runs from now on with a stage (``prefill``/``decode``) and step."""
        self.recorder.stage, self.recorder.step = stage, step


@contextmanager
def tracing(name: str = "trace") -> Iterator[Tracing]:
    """Record every aten op PyTorch runs inside the block (any model, any loop) into ``t.graph``.

    >>> import torch, opgraph  # doctest: +SKIP
    >>> with opgraph.tracing() as t:  # doctest: +SKIP
    ...     torch.nn.Linear(4, 8)(torch.randn(2, 4))
    >>> t.graph.ops[0].kind  # doctest: +SKIP
    <OpKind.GEMM: 'gemm'>
    """
    rec = Recorder()
    handle = Tracing(rec, name)
    with rec.recording():
        yield handle
