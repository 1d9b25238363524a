"""The public API: :func:`capture` a model into an :class:`~opgraph.ir.OpGraph`, and :func:`tracing`
whatever PyTorch runs inside a ``with`` block.

Phases: ``prefill`` (``batch`` x ``seq_len`` new tokens, an empty KV cache), ``decode`` (one token per
sequence over a KV cache of ``kv_len`` tokens, filled beforehand without recording), ``generate``
(a prefill then ``new_tokens`` greedy decode steps, each op tagged with its stage and step).

The model is built directly on the target device from its config (``meta``: no weights, any size;
``cpu``/``cuda``: random weights). Mixture-of-experts layers run with modelled routing
(:mod:`opgraph.capture.moe_model`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from opgraph.capture.lowering import DEFAULT_PIPELINE, Hints, Lowering, run_passes
from opgraph.capture.lowering.build import build_ops, group_order
from opgraph.capture.recorder import Recorder
from opgraph.capture.sources import CaptureError, ConfigError, ModelSource, build_config, resolve
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.graph import GraphMetadata, OpGraph

Phase = Literal["prefill", "decode", "generate"]


class PhaseRecorder(Protocol):
    """What :func:`run_phase` needs of a recorder: stage tags and the blocks it records in."""

    stage: str | None
    step: int | None

    def recording(self) -> AbstractContextManager[Any]:
        """Record what runs inside."""
        ...

    def scope(self, name: str) -> AbstractContextManager[None]:
        """Record what runs inside as module ``name``."""
        ...


PHASES = ("prefill", "decode", "generate")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ATTN_IMPLS = ("sdpa", "eager")
DEVICES = ("meta", "cpu", "cuda")


@dataclass(frozen=True)
class CaptureOptions:
    """What to capture; checked by :meth:`validate`."""

    phase: str = "prefill"
    batch: int = 1
    seq_len: int = 512
    """Prompt tokens per sequence (prefill and generate)."""
    kv_len: int = 2048
    """Tokens already in the KV cache (decode)."""
    new_tokens: int = 4
    """Decode steps after the prefill (generate)."""
    dtype: str = "bf16"
    layers: int | None = None
    attn_impl: str = "sdpa"
    device: str = "meta"
    moe_skew: float | None = None
    trust_remote_code: bool = False
    host_timing: bool = False
    """Also measure the framework's host time before each op (:mod:`opgraph.capture.hosttime`)."""

    def validate(self) -> None:
        """Raise :class:`CaptureError` on an impossible request."""
        if self.phase not in PHASES:
            raise CaptureError(f"unknown phase {self.phase!r}", where="--phase", hint=f"one of {', '.join(PHASES)}")
        if self.batch < 1:
            raise CaptureError("must be at least 1", where="--batch")
        if self.phase in ("prefill", "generate") and self.seq_len < 1:
            raise CaptureError(f"must be at least 1 (got {self.seq_len})", where="--seq-len")
        if self.phase == "decode" and self.kv_len < 1:
            raise CaptureError(f"must be at least 1 (got {self.kv_len})", where="--kv-len")
        if self.phase == "generate" and self.new_tokens < 1:
            raise CaptureError(f"must be at least 1 (got {self.new_tokens})", where="--new-tokens")
        if self.dtype not in DTYPES:
            raise CaptureError(f"unknown dtype {self.dtype!r}", where="--dtype", hint=f"one of {', '.join(DTYPES)}")
        if self.attn_impl not in ATTN_IMPLS:
            raise CaptureError(
                f"unknown attention implementation {self.attn_impl!r}",
                where="--attn-impl",
                hint=f"one of {', '.join(ATTN_IMPLS)}",
            )
        if self.device not in DEVICES:
            raise CaptureError(f"unknown device {self.device!r}", where="--device", hint=f"one of {', '.join(DEVICES)}")
        if self.moe_skew is not None and not 0 <= self.moe_skew <= 8:
            raise CaptureError("must be between 0 (balanced) and 8", where="--moe-skew")
        if self.layers is not None and self.layers < 1:
            raise CaptureError("must be at least 1", where="--layers")

    @property
    def positions(self) -> int:
        """Largest position the capture reaches."""
        if self.phase == "decode":
            return self.kv_len + 1
        if self.phase == "generate":
            return self.seq_len + self.new_tokens
        return self.seq_len


@dataclass
class PreparedModel:
    """A model built on its device with what the capture needs to know about it."""

    name: str
    model: Any
    config: Any
    hints: Hints
    source: ModelSource | None
    assumptions: list[str] = field(default_factory=list)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def hints_from_config(config: Any) -> Hints:
    """Head counts, MLA and sliding windows from a transformers config."""
    if config is None:
        return Hints()
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    windows: dict[int, int] = {}
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window and isinstance(types, list | tuple):
        windows = {i: int(window) for i, t in enumerate(types) if "sliding" in str(t)}
    return Hints(
        num_heads=heads, num_kv_heads=kv, mla=bool(getattr(config, "kv_lora_rank", None)), layer_windows=windows
    )


def _check_positions(config: Any, opts: CaptureOptions, name: str) -> None:
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and opts.positions > limit:
        what = "--kv-len" if opts.phase == "decode" else "--seq-len"
        raise CaptureError(
            f"{opts.positions} positions exceed the model's max_position_embeddings ({limit})",
            where=what,
            hint=f"{name} supports at most {limit} positions",
        )


def prepare(model_or_id: Any, opts: CaptureOptions) -> PreparedModel:
    """Resolve and build the model on ``opts.device`` (or take a given ``nn.Module``)."""
    import torch

    opts.validate()
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise CaptureError("CUDA is not available here", where="--device", hint="use --device meta or cpu")
    if isinstance(model_or_id, torch.nn.Module):
        model = model_or_id
        config = getattr(model, "config", None)
        name = type(model).__name__
        source = None
    else:
        import transformers

        transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        source = resolve(str(model_or_id))
        config = build_config(source, layers=opts.layers, trust_remote_code=opts.trust_remote_code)
        name = source.name
        _check_positions(config, opts, name)
        model, used_impl = _build(config, opts, name)
    from opgraph.capture import moe_model

    prepared = PreparedModel(name, model, config, hints_from_config(config), source)
    if not isinstance(model_or_id, torch.nn.Module) and used_impl != opts.attn_impl and has_attention(model):
        prepared.assumptions.append(
            f"{name} has no {opts.attn_impl} attention in this transformers; captured with {used_impl} attention"
        )
    if moe_model.install(model, opts.moe_skew or 0.0):
        prepared.assumptions.append(
            moe_model.skew_assumption(opts.moe_skew) if opts.moe_skew else moe_model.BALANCED_ASSUMPTION
        )
    return prepared


def has_attention(model: Any) -> bool:
    """True when some submodule is an attention block (state-space models such as Mamba have none)."""
    return any("attention" in type(m).__name__.lower() for m in model.modules())


def _build(config: Any, opts: CaptureOptions, name: str) -> tuple[Any, str]:
    import torch
    import transformers

    impl = opts.attn_impl
    try:
        for attempt in (impl, "eager"):
            try:
                with torch.device(opts.device):
                    model = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                        config,
                        dtype=_torch_dtype(opts.dtype),
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
    except RuntimeError as exc:  # torch refusing a size the config gave (a negative dimension)
        msg = " ".join(str(exc).split())
        raise ConfigError(
            f"transformers cannot build this model ({msg[:240]})", where=name, hint="check the sizes in the config"
        ) from None
    model.eval()
    return model, impl


def _forward_kwargs(model: Any) -> tuple[str, bool]:
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    return cache_kw, "logits_to_keep" in params


def _new_cache(config: Any) -> Any:
    import transformers

    try:
        return transformers.DynamicCache(config=config)
    except TypeError:
        return transformers.DynamicCache()


def token_ids(prepared: PreparedModel, opts: CaptureOptions, batch: int, length: int, seed: int = 0) -> Any:
    """Input token ids: seeded random tokens on real devices (a prompt of identical tokens makes every
    activation row equal, which runs matrix units at unrealistically low power), zeros on meta."""
    import torch

    if opts.device == "meta":
        return torch.zeros(batch, length, dtype=torch.long, device="meta")
    vocab = int(getattr(prepared.config, "vocab_size", 0) or 32000)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen, dtype=torch.long).to(opts.device)


def setup_phase(prepared: PreparedModel, opts: CaptureOptions) -> Any:
    """The KV cache the phase starts from: empty, or (decode) filled with ``kv_len`` tokens, unrecorded.

    Kept apart from :func:`run_phase` so that timed and profiled runs cover the phase alone.
    """
    import torch

    cache = _new_cache(prepared.config)
    if opts.phase == "decode":
        cache_kw, _ = _forward_kwargs(prepared.model)
        ids = token_ids(prepared, opts, opts.batch, opts.kv_len, seed=1)
        with torch.no_grad():
            prepared.model(input_ids=ids, use_cache=True, **{cache_kw: cache})
    return cache


def run_phase(prepared: PreparedModel, opts: CaptureOptions, rec: PhaseRecorder | None, cache: Any = None) -> None:
    """Run the phase's forward passes (recorded when ``rec`` is given).

    ``cache`` comes from :func:`setup_phase`; without it the phase sets itself up first (a decode
    cache is then filled inside this call, unrecorded).
    """
    import torch

    model = prepared.model
    cache_kw, has_keep = _forward_kwargs(model)

    def forward(ids: Any, cache: Any, stage: str, step: int, keep_last: bool = False) -> Any:
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True, cache_kw: cache}
        if keep_last and has_keep:
            kwargs["logits_to_keep"] = 1
        if rec is None:
            return model(**kwargs)
        rec.stage, rec.step = stage, step
        with rec.recording():
            return model(**kwargs)

    if cache is None:
        cache = setup_phase(prepared, opts)
    with torch.no_grad():
        b = opts.batch
        if opts.phase == "decode":
            forward(token_ids(prepared, opts, b, 1, seed=2), cache, "decode", 1)
            return
        generate = opts.phase == "generate"
        out = forward(token_ids(prepared, opts, b, opts.seq_len), cache, "prefill", 0, generate)
        if not generate:
            return
        for step in range(1, opts.new_tokens + 1):
            ids = _sample(out.logits, rec)
            out = forward(ids, cache, "decode", step, True)


def _sample(logits: Any, rec: PhaseRecorder | None) -> Any:
    # Greedy sampling, recorded in a "sampler" scope.
    if rec is None:
        return logits[:, -1, :].argmax(dim=-1, keepdim=True)
    with rec.recording(), rec.scope("sampler"):
        return logits[:, -1, :].argmax(dim=-1, keepdim=True)


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
    settings: dict[str, Any] | None = None,
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
        capture=settings or {},
        versions=_versions(),
        assumptions=tuple(notes),
    )
    return OpGraph.model_construct(metadata=md, ops=tuple(ops), edges=tuple(edges)), event_op


def _metadata_args(prepared: PreparedModel, opts: CaptureOptions) -> dict[str, Any]:
    cfg = prepared.config
    arch = type(prepared.model).__name__
    settings: dict[str, Any] = {
        "batch": opts.batch,
        "dtype": opts.dtype,
        "device": opts.device,
        "attn_impl": opts.attn_impl,
    }
    if opts.phase in ("prefill", "generate"):
        settings["seq_len"] = opts.seq_len
    if opts.phase == "decode":
        settings["kv_len"] = opts.kv_len
    if opts.phase == "generate":
        settings["new_tokens"] = opts.new_tokens
    if opts.layers is not None:
        settings["layers"] = opts.layers
    if opts.moe_skew is not None:
        settings["moe_skew"] = opts.moe_skew
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
) -> OpGraph:
    """Capture a causal LM into a typed op graph.

    ``model_or_id`` is a preset key or HF id of a preset, a ``config.json`` path, a model folder, a
    hub id in the local HF cache, or an ``nn.Module`` taking ``input_ids``. For a measured timeline
    as well, use :func:`opgraph.capture.profile_capture`. ``host_timing`` also measures the host
    time the framework spends before each op on this machine (``OpBase.host_gap_us``, see
    :mod:`opgraph.capture.hosttime`).

    >>> g = capture("llama-3.2-1b", seq_len=16, layers=1)  # doctest: +SKIP
    >>> g.summary()["by_kind"]["gemm"]["ops"]  # doctest: +SKIP
    8
    """
    opts = CaptureOptions(
        phase,
        batch,
        seq_len,
        kv_len,
        new_tokens,
        dtype,
        layers,
        attn_impl,
        device,
        moe_skew,
        trust_remote_code,
        host_timing,
    )
    rec = record(model_or_id, opts)
    return add_host_timing(rec.graph, rec.recorder, rec.event_op, rec.prepared, opts)


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
    from opgraph.capture.hosttime import measure_host_gaps, with_host_gaps

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
