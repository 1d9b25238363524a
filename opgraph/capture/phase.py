"""Options of a capture and the phase runner: the forward passes of ``prefill``, ``decode`` or
``generate`` over a prepared model, recorded or not.

Kept apart from :mod:`opgraph.capture.api` (which records and lowers) so that what only runs the
phase (host timing, profiling, benchmarks) does not import the capture API back.
"""

from __future__ import annotations

import functools
import inspect
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from opgraph.capture.lowering import Hints
from opgraph.capture.sources import CaptureError, ModelSource
from opgraph.ir.dtypes import DType
from opgraph.ir.generation import SAMPLER_SCOPE

Phase = Literal["prefill", "decode", "generate"]
"""What a capture runs: a prompt, one decode step over a filled cache, or a prompt then decode steps."""
CaptureDType = Literal["bf16", "fp16", "fp32"]
"""Dtype the model is built in."""
AttnImpl = Literal["sdpa", "eager"]
"""transformers attention implementation asked for."""
DEVICE_CHOICES = ("meta", "cpu", "cuda", "cuda:N")
"""The devices a capture runs on, as ``--device`` takes them (``cuda``: the current CUDA device)."""


def parse_device(text: str) -> str:
    """The capture device ``text`` names: ``meta``, ``cpu``, ``cuda`` or ``cuda:N`` (the index written
    plainly, ``cuda:01`` -> ``cuda:1``); anything else is a :class:`CaptureError` naming ``--device``.

    Only the spelling is checked: whether the device exists here is :func:`check_device`'s job.

    >>> parse_device("cuda:01"), parse_device("cuda"), parse_device("meta")
    ('cuda:1', 'cuda', 'meta')
    """
    kind, colon, index = text.partition(":")
    if kind not in ("meta", "cpu", "cuda") or (colon and kind != "cuda"):
        raise CaptureError(f"unknown device {text!r}", where="--device", hint=f"one of {', '.join(DEVICE_CHOICES)}")
    if not colon:
        return kind
    if not re.fullmatch(r"[0-9]+", index):
        raise CaptureError(
            f"unknown device {text!r}: the N of cuda:N is a device index, a number",
            where="--device",
            hint="e.g. cuda:0, cuda:1",
        )
    return f"cuda:{int(index)}"


def check_device(device: str) -> None:
    """Fail with one :class:`CaptureError` line naming ``--device`` when ``device`` (as :func:`parse_device`
    spells it) is not here: CUDA without a CUDA device, or ``cuda:N`` at or above the visible count.

    ``meta`` and ``cpu`` are always here; torch is imported only for CUDA.
    """
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return
    from hardware.devices import cuda_problem

    problem = cuda_problem(device, int(index) if index else None)
    if problem is not None:
        hint = "use --device meta or cpu" if problem.no_cuda else "pick one of those or check CUDA_VISIBLE_DEVICES"
        raise CaptureError(problem.message, where="--device", hint=hint)


CaptureDevice = Annotated[str, AfterValidator(parse_device)]
"""Where the model is built and run: ``meta`` (no weights, no data), ``cpu``, ``cuda`` or ``cuda:N``
(random weights); checked by :func:`parse_device`."""

_LABELS = {"phase": "phase", "dtype": "dtype", "attn_impl": "attention implementation", "device": "device"}
_CHOICES: dict[str, tuple[str, ...]] = {
    "phase": get_args(Phase),
    "dtype": get_args(CaptureDType),
    "attn_impl": get_args(AttnImpl),
    "device": DEVICE_CHOICES,
}
_RANGES = {"moe_skew": "must be between 0 (balanced) and 8", "seed": "must be 0 or more"}


def _option_error(exc: ValidationError) -> CaptureError:
    """The first problem of ``exc`` as a one-line error naming the CLI option."""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else ""
    where = "--" + name.replace("_", "-") if name else "capture options"
    value = err.get("input")
    if name in _CHOICES:
        return CaptureError(
            f"unknown {_LABELS[name]} {value!r}", where=where, hint=f"one of {', '.join(_CHOICES[name])}"
        )
    if err["type"] == "extra_forbidden":
        return CaptureError(f"unknown capture option {name!r}", where="capture options")
    if name in _RANGES and err["type"] in ("greater_than_equal", "less_than_equal"):
        return CaptureError(_RANGES[name], where=where)
    if err["type"] == "greater_than_equal":
        return CaptureError(f"must be at least 1 (got {value!r})", where=where)
    return CaptureError(f"{err['msg']} (got {value!r})", where=where)


class CaptureOptions(BaseModel):
    """What to capture. Checked when made: a bad value raises :class:`CaptureError` naming its option."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase = "prefill"
    batch: Annotated[int, Field(ge=1)] = 1
    seq_len: int = 512
    """Prompt tokens per sequence (prefill and generate)."""
    kv_len: int = 2048
    """Tokens already in the KV cache (decode)."""
    new_tokens: int = 4
    """Decode steps after the prefill (generate)."""
    dtype: CaptureDType = "bf16"
    layers: Annotated[int, Field(ge=1)] | None = None
    """Keep only the first layers (at most the model's count)."""
    attn_impl: AttnImpl = "sdpa"
    device: CaptureDevice = "meta"
    """``meta``, ``cpu``, ``cuda`` or ``cuda:N`` (:func:`parse_device`); :meth:`validate` checks it is here."""
    moe_skew: Annotated[float, Field(ge=0, le=8)] | None = None
    """Zipf exponent of modelled expert loads (``None``: balanced)."""
    seed: Annotated[int, Field(ge=0)] = 0
    """Seed of the random weights on a real device (``torch.manual_seed`` just before the model is built
    on it): the same seed, config and dtype give the same weights, hence the same MoE routing."""
    weights: bool = False
    """Load the model's own weights from its checkpoint (a model folder or cached hub id with weight files)
    on a real device instead of drawing random ones: the routing a trained MoE router gives."""
    trust_remote_code: bool = False
    host_timing: bool = False
    """Also measure the framework's host time before each op (:mod:`opgraph.capture.hosttime`)."""

    @model_validator(mode="wrap")
    @classmethod
    def _named_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise _option_error(exc) from None

    @model_validator(mode="after")
    def _weights_need_a_device(self) -> CaptureOptions:
        if self.weights and self.device == "meta":
            raise CaptureError(
                "only applies to a model built on cpu or cuda (meta holds no weights)",
                where="--weights",
                hint="add --device cpu to load the checkpoint on this machine",
            )
        return self

    @model_validator(mode="after")
    def _phase_sizes(self) -> CaptureOptions:
        # Sizes the phase uses must be positive; the others are ignored.
        if self.phase in ("prefill", "generate") and self.seq_len < 1:
            raise CaptureError(f"must be at least 1 (got {self.seq_len})", where="--seq-len")
        if self.phase == "decode" and self.kv_len < 1:
            raise CaptureError(f"must be at least 1 (got {self.kv_len})", where="--kv-len")
        if self.phase == "generate" and self.new_tokens < 1:
            raise CaptureError(f"must be at least 1 (got {self.new_tokens})", where="--new-tokens")
        return self

    def validate(self) -> None:  # type: ignore[override]
        """Check what depends on this machine (the values were checked when made): that the device is
        here (:func:`check_device`). A :class:`CaptureError` naming ``--device`` otherwise."""
        check_device(self.device)

    @property
    def device_type(self) -> str:
        """The device without its index: ``meta``, ``cpu`` or ``cuda`` (for ``cuda:1`` too)."""
        return self.device.partition(":")[0]

    @property
    def positions(self) -> int:
        """Largest position the capture reaches."""
        if self.phase == "decode":
            return self.kv_len + 1
        if self.phase == "generate":
            return self.seq_len + self.new_tokens
        return self.seq_len

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype the model is built in."""
        import torch

        return getattr(torch, str(DType(self.dtype).torch_name))


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


@dataclass
class PreparedModel:
    """A model built on its device with what the capture needs to know about it."""

    name: str
    model: Any
    config: Any
    hints: Hints
    source: ModelSource | None
    assumptions: list[str] = field(default_factory=list)


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

    run = PhaseRun(prepared, opts, rec, setup_phase(prepared, opts) if cache is None else cache)
    with torch.no_grad():
        if opts.phase == "decode":
            run.forward(token_ids(prepared, opts, opts.batch, 1, seed=2), "decode", 1)
            return
        run.prefill()
        if opts.phase == "generate":
            for step in range(1, opts.new_tokens + 1):
                run.decode(step)
            run.sample()  # generate samples after its last forward pass too


class PhaseRun:
    """The forward passes of a phase, one at a time (call under ``torch.no_grad()``).

    A generate phase is :meth:`prefill` then :meth:`decode` for steps 1..``new_tokens``, then the last
    step's :meth:`sample`; the sampler that picks each step's next token runs (tagged with that step) at
    the start of the next step, or earlier through :meth:`sample`.
    """

    def __init__(self, prepared: PreparedModel, opts: CaptureOptions, rec: PhaseRecorder | None, cache: Any) -> None:
        self.prepared = prepared
        self.opts = opts
        self.rec = rec
        self.cache = cache
        self.out: Any = None
        self.ids: Any = None
        """The sampled next tokens, when :meth:`sample` ran ahead of :meth:`decode`."""
        self.cache_kw, self.has_keep = _forward_kwargs(prepared.model)
        self.loop: GreedyLoop | None = None
        """The generation's state between forward passes (from the prefill of a generate phase on)."""

    def forward(self, ids: Any, stage: str, step: int, keep_last: bool = False) -> Any:
        """One forward pass over ``ids`` with the cache, tagged ``stage``/``step`` when recorded."""
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True, self.cache_kw: self.cache}
        if keep_last and self.has_keep:
            kwargs["logits_to_keep"] = 1
        mask = self.loop.attention_mask if self.loop is not None else None
        # Passed as generate passes it, where it keeps the mask; not unrecorded on meta, where the model
        # cannot read whether the mask is all ones (the recorder stands in for that value when recording).
        if mask is not None and (self.rec is not None or self.opts.device != "meta"):
            kwargs["attention_mask"] = mask
        if self.rec is None:
            self.out = self.prepared.model(**kwargs)
        else:
            self.rec.stage, self.rec.step = stage, step
            with self.rec.recording():
                self.out = self.prepared.model(**kwargs)
        return self.out

    def prefill(self) -> None:
        """The prompt's forward pass (step 0)."""
        generate = self.opts.phase == "generate"
        ids = token_ids(self.prepared, self.opts, self.opts.batch, self.opts.seq_len)
        if generate:
            self.loop = GreedyLoop(ids, self.prepared.config, loop_max_length(self.opts))
        self.forward(ids, "prefill", 0, generate)

    def sample(self) -> None:
        """Pick the next tokens from the last forward pass as ``generate`` does between forward passes
        (:class:`GreedyLoop`), tagged with that pass's step."""
        if self.loop is None:
            raise RuntimeError("sample() before the prefill of a generate phase")
        if self.rec is None:
            # Unrecorded on meta there is no flag to read (the recorder stands in for it when recording).
            self.ids = self.loop.step(self.out.logits, read_flag=self.opts.device != "meta")
            return
        with self.rec.recording(), self.rec.scope(SAMPLER_SCOPE):
            self.ids = self.loop.step(self.out.logits)

    def decode(self, step: int) -> None:
        """Sample the previous step's token (unless :meth:`sample` did), then decode step ``step``."""
        if self.ids is None:
            self.sample()
        ids, self.ids = self.ids, None
        self.forward(ids, "decode", step, True)


def loop_max_length(opts: CaptureOptions) -> int:
    """The maximum length the capture's :class:`GreedyLoop` stops at: one token past the graph's last
    step, so that every step runs the same stopping ops (``generate`` itself fills its maximum-length
    flag with True after its last forward pass, an op of the same cost as every other step's False)."""
    return opts.seq_len + opts.new_tokens + 2


def _eos_and_pad(config: Any) -> tuple[list[int], int | None]:
    """The model's EOS token ids and the pad token ``generate`` fills finished rows with (the first EOS
    id when the model names none), from its generation config or, failing that, its config."""
    sources = [getattr(config, "generation_config", None), config]

    def first(name: str) -> Any:
        return next((v for v in (getattr(c, name, None) for c in sources) if v is not None), None)

    eos, pad = first("eos_token_id"), first("pad_token_id")
    ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])]
    return ids, int(pad) if pad is not None else (ids[0] if ids else None)


@functools.cache
def generate_keeps_all_ones_mask() -> bool:
    """Whether the installed transformers' ``generate`` keeps an all-ones 2-D attention mask through its
    loop (before 5.18), rather than dropping it before the loop (5.18 on)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version("5.18")


class GreedyLoop:
    """What transformers' ``generate`` runs between two forward passes when it decodes greedily with the
    model's default stopping criteria (``GenerationMixin._sample`` and the helpers it calls), op for op:
    the position ids advanced by one, the last position's logits copied to fp32 and arg-maxed, finished
    rows given the pad token (when the model has EOS tokens), the token appended to the ids, the stopping
    criteria (maximum length, EOS), the stop flag the host reads after every step (a device sync), and
    the next forward pass's inputs sliced out of the ids and position ids.

    transformers before 5.18 keeps the all-ones attention mask (what ``generate`` makes for a prompt
    without padding) and passes it to every forward pass, growing it by one column each step (a
    ``new_ones`` and a ``cat`` over the whole mask); from 5.18 on ``generate`` drops it before the loop.
    The loop follows the installed version (:func:`generate_keeps_all_ones_mask`): ``attention_mask``
    is then that mask, else ``None``.

    ``tests/opgraph/capture/test_greedy_loop.py`` checks the aten calls against transformers' own loop.
    """

    def __init__(self, prompt: Any, config: Any, max_length: int) -> None:
        import torch

        batch, length = prompt.shape
        dev = prompt.device
        eos, pad = _eos_and_pad(config)
        self.input_ids = prompt
        self.position_ids = torch.arange(length, dtype=torch.long, device=dev).expand(batch, length).contiguous()
        self.eos = torch.tensor(eos, dtype=torch.long, device=dev) if eos else None
        self.pad = torch.tensor(pad if pad is not None else 0, dtype=torch.long, device=dev)
        self.unfinished = torch.ones(batch, dtype=torch.long, device=dev)
        self.max_length = max_length
        self.attention_mask: Any = torch.ones_like(prompt) if generate_keeps_all_ones_mask() else None
        """The 2-D mask ``generate`` passes to each forward pass, when the installed version keeps it."""

    def step(self, logits: Any, read_flag: bool = True) -> Any:
        """The next forward pass's input ids, from the last one's ``logits`` (``read_flag``: read the
        stop flag on the host, as ``generate`` does)."""
        import torch

        dev = self.input_ids.device
        step = torch.arange(1, dtype=self.position_ids.dtype, device=dev).view(1, -1)
        self.position_ids = torch.cat([self.position_ids, step + self.position_ids[..., -1:] + 1], dim=-1)
        if self.attention_mask is not None:
            mask = self.attention_mask
            self.attention_mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)
        tokens = torch.argmax(scores, dim=-1)
        if self.eos is not None:
            tokens = tokens * self.unfinished + self.pad * (1 - self.unfinished)
        self.input_ids = torch.cat([self.input_ids, tokens[:, None]], dim=-1)
        batch, length = self.input_ids.shape
        done = torch.full((batch,), False, device=dev, dtype=torch.bool)
        done = done | torch.full((batch,), length >= self.max_length, device=dev, dtype=torch.bool)
        if self.eos is not None:
            done = done | torch.isin(self.input_ids[:, -1:], self.eos).any(dim=-1)
        self.unfinished = self.unfinished & ~done
        finished = self.unfinished.max() == 0
        if read_flag:
            bool(finished)  # the host reads the stop flag: on a GPU, a sync every step
        ids = self.input_ids[:, -1:].clone(memory_format=torch.contiguous_format)
        self.position_ids[..., -1:].clone(memory_format=torch.contiguous_format)
        return ids
