"""Synthetic inputs on the device: the right shapes, dtypes and strides, and values in valid ranges.

Values matter even when only time is measured: an index out of range faults, a NaN can take a
slower path, a mask inconsistent with the causal flag changes what attention computes. Each
tensor is made from a :class:`Domain` that says which values are valid for its role (normal data,
positive data, indices below a bound, booleans, a causal mask). torch is imported lazily.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from opgraph.ir import DType, OpgraphError, TensorSpec

if TYPE_CHECKING:
    import torch


class DeviceError(OpgraphError):
    """The requested device does not exist or cannot be used."""


class DomainKind(str, Enum):
    """Which values a synthetic tensor holds."""

    NORMAL = "normal"
    """Standard normal floats (ints: small non-negative values)."""
    POSITIVE = "positive"
    """Floats in [0.5, 1.5] (ints in [1, 16]): safe for log, sqrt, rsqrt and divisors."""
    PROBS = "probs"
    """Non-negative floats summing to one along the last dimension."""
    INDEX = "index"
    """Integers in ``[0, bound)``; unique along the flattened tensor when ``unique`` and possible."""
    BOOL = "bool"
    """Random booleans."""
    CAUSAL_MASK = "causal_mask"
    """An attention mask over the last two dims (q_len, kv_len), bottom-right aligned causal."""
    ZEROS = "zeros"
    """All zeros."""


@dataclass(frozen=True)
class Domain:
    """The values of one synthetic tensor."""

    kind: DomainKind = DomainKind.NORMAL
    bound: int = 0
    """Exclusive upper bound of ``INDEX`` values."""
    unique: bool = False
    """``INDEX`` values distinct (index_put without accumulate, scatter targets)."""
    window: int | None = None
    """Sliding window of a ``CAUSAL_MASK``."""


NORMAL = Domain()
POSITIVE = Domain(DomainKind.POSITIVE)
BOOL = Domain(DomainKind.BOOL)


def index(bound: int, *, unique: bool = False) -> Domain:
    """Integers in ``[0, bound)``."""
    return Domain(DomainKind.INDEX, bound=max(1, int(bound)), unique=unique)


def torch_dtype(dtype: DType | str) -> torch.dtype:
    """The torch dtype of an IR dtype; :class:`OpgraphError` for types torch lacks (fp4)."""
    import torch

    d = DType(dtype)
    name = d.torch_name
    tdt = getattr(torch, name, None) if name else None
    if tdt is None:
        raise OpgraphError(f"dtype {d.value} has no torch equivalent in torch {torch.__version__}")
    assert isinstance(tdt, torch.dtype)
    return tdt


def resolve_device(device: str) -> torch.device:
    """Check that ``device`` exists and return it; :class:`DeviceError` with a hint otherwise.

    ``cuda`` means the current CUDA device; ``cuda:N`` must be below the visible device count.
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise DeviceError(
            f"{device!r} is not a device ({exc})", where="--device", hint="use cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        from hardware.devices import cuda_problem

        problem = cuda_problem(device, dev.index)
        if problem is not None:
            hint = "use --device cpu" if problem.no_cuda else "pick one of those or check CUDA_VISIBLE_DEVICES"
            raise DeviceError(problem.message, where="--device", hint=hint)
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if callable(available) and available():
        return dev
    raise DeviceError(f"device type {dev.type!r} is not available here", where="--device", hint="use cpu or cuda")


def device_name(dev: torch.device) -> str:
    """The model name of a device: the GPU's name, or the CPU's model from /proc/cpuinfo."""
    import platform

    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    if dev.type == "cpu":
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    if line.lower().startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return dev.type


def storage_numel(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements a strided tensor's storage must hold (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides, strict=True))


def _fill(n: int, dtype: torch.dtype, dom: Domain, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """A flat tensor of ``n`` values of the domain."""
    import torch

    if dtype == torch.bool:
        if dom.kind is DomainKind.ZEROS:
            return torch.zeros(n, dtype=dtype, device=device)
        return torch.rand(n, generator=gen, device=device) < 0.5
    is_float = dtype.is_floating_point or dtype.is_complex
    if dom.kind is DomainKind.ZEROS:
        return torch.zeros(n, dtype=dtype, device=device)
    if dom.kind is DomainKind.INDEX:
        if dom.unique and n <= dom.bound:
            vals = torch.randperm(dom.bound, generator=gen, device=device)[:n]
        else:
            vals = torch.randint(0, dom.bound, (n,), generator=gen, device=device)
        return vals.to(dtype)
    if not is_float:
        lo, hi = (1, 17) if dom.kind is DomainKind.POSITIVE else (0, 16)
        if dtype == torch.uint8 or dtype == torch.int8:
            hi = min(hi, 100)
        return torch.randint(lo, hi, (n,), generator=gen, device=device).to(dtype)
    gen_dtype = torch.float32 if dtype.itemsize < 4 or dtype.is_complex else dtype
    if dom.kind is DomainKind.POSITIVE:
        vals = torch.rand(n, generator=gen, device=device, dtype=gen_dtype) + 0.5
    else:
        vals = torch.randn(n, generator=gen, device=device, dtype=gen_dtype)
    return vals.to(dtype)


def make_tensor(spec: TensorSpec, device: torch.device, gen: torch.Generator, dom: Domain = NORMAL) -> torch.Tensor:
    """A tensor with ``spec``'s shape, dtype and strides on ``device``, holding values of ``dom``."""
    import torch

    dtype = torch_dtype(spec.dtype)
    shape = tuple(spec.shape)
    if dom.kind is DomainKind.CAUSAL_MASK and len(shape) >= 2:
        t = causal_mask(shape[-2], shape[-1], device=device, dtype=dtype, window=dom.window).expand(shape)
        return (
            t.contiguous()
            if spec.strides is None
            else torch.empty_strided(shape, spec.strides, dtype=dtype, device=device).copy_(t)
        )
    if dom.kind is DomainKind.PROBS:
        base = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) + 0.01
        base = base / base.sum(-1, keepdim=True) if shape else base
        return base.to(dtype)
    if spec.strides is None:
        return _fill(math.prod(shape), dtype, dom, device, gen).reshape(shape)
    strides = tuple(spec.strides)
    if any(st < 0 for st in strides):
        return _fill(math.prod(shape), dtype, dom, device, gen).reshape(shape)
    flat = _fill(storage_numel(shape, strides), dtype, dom, device, gen)
    return flat.as_strided(shape, strides)


def causal_mask(
    q_len: int,
    kv_len: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
    window: int | None = None,
) -> torch.Tensor:
    """A ``[q_len, kv_len]`` attention mask, bottom-right aligned as in a KV cache.

    Query ``i`` sits at position ``kv_len - q_len + i`` and may see keys up to it (and no more
    than ``window`` of them). Boolean masks are True where attention is allowed; float masks are 0
    there and the dtype's lowest value elsewhere (as transformers builds them).
    """
    import torch

    q_pos = torch.arange(q_len, device=device).unsqueeze(-1) + (kv_len - q_len)
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
    allowed = k_pos <= q_pos
    if window is not None:
        allowed = allowed & (k_pos > q_pos - window)
    if dtype == torch.bool:
        return allowed
    low = torch.finfo(dtype).min
    return torch.zeros((q_len, kv_len), device=device, dtype=dtype).masked_fill(~allowed, low)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator on ``device`` (so inputs are reproducible run to run)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def routing_counts(tokens: int, experts: int, top_k: int, skew: float = 0.0) -> list[int]:
    """Rows per expert when ``tokens`` tokens each pick ``top_k`` experts.

    ``skew`` 0 is balanced routing (the capture default: every expert gets ``tokens * top_k /
    experts`` rows, the remainder spread over the first experts); a positive skew gives a Zipf
    profile ``1 / (rank + 1) ** skew``. No expert gets more than ``tokens`` rows (a token picks
    an expert once) and the counts always sum to ``tokens * top_k``.
    """
    total = tokens * top_k
    if experts <= 0 or total <= 0:
        return [0] * max(experts, 0)
    if skew <= 0:
        base, extra = divmod(total, experts)
        counts = [base + (1 if e < extra else 0) for e in range(experts)]
    else:
        weights = [1.0 / (e + 1) ** skew for e in range(experts)]
        s = sum(weights)
        counts = [int(total * w / s) for w in weights]
        for e in range(total - sum(counts)):
            counts[e % experts] += 1
    # Cap at ``tokens`` and move the excess to the least loaded experts.
    excess = 0
    for e in range(experts):
        if counts[e] > tokens:
            excess += counts[e] - tokens
            counts[e] = tokens
    e = experts - 1
    while excess > 0 and e >= 0:
        room = tokens - counts[e]
        take = min(room, excess)
        counts[e] += take
        excess -= take
        e -= 1
    return counts


def routing_skew(assumptions: tuple[str, ...], capture: dict[str, object] | None = None) -> float:
    """The MoE routing skew a graph assumed (0 for balanced), from its metadata.

    Reads ``capture["moe_skew"]`` or ``capture["moe_routing"]`` (``balanced`` or ``skew:0.8``)
    and, failing that, an assumption line giving the skew (``skew 0.8``, ``Zipf law of exponent 0.8``).
    """
    import re

    cap = capture or {}
    for key in ("moe_skew", "routing_skew"):
        val = cap.get(key)
        if isinstance(val, int | float) and not isinstance(val, bool):
            return float(val)
    routing = cap.get("moe_routing")
    texts = [routing] if isinstance(routing, str) else []
    texts += [a for a in assumptions if "skew" in a.lower() or "routing" in a.lower()]
    for text in texts:
        assert isinstance(text, str)
        m = re.search(r"(?:skew|zipf law of exponent)\D{0,3}([0-9]*\.?[0-9]+)", text, re.IGNORECASE)
        if m:
            return float(m.group(1))
    return 0.0


def match_inputs(values: tuple[object, ...] | list[object], specs: tuple[TensorSpec, ...]) -> list[int | None]:
    """Which of ``values`` (a recipe's case inputs) stands for each recorded input spec, or ``None``.

    Recipes build their inputs in their own order and layout (rope puts cos and sin first, a
    linear may build a 2-D input for a recorded 3-D one). Each spec takes, in order, the first
    unclaimed tensor of the same shape and dtype; specs left over then take the first unclaimed
    tensor of the same dtype and element count. Tensors that stand for no spec stay unclaimed.
    """
    import torch

    tensors = [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    wanted: list[torch.dtype | None] = []
    for spec in specs:
        try:
            wanted.append(torch_dtype(spec.dtype))
        except OpgraphError:
            wanted.append(None)
    out: list[int | None] = [None] * len(specs)
    claimed: set[int] = set()
    tests = (
        lambda spec, t: tuple(t.shape) == tuple(spec.shape),
        lambda spec, t: t.numel() == spec.numel,
    )
    for same in tests:
        for s, spec in enumerate(specs):
            if out[s] is not None or wanted[s] is None:
                continue
            for i, t in tensors:
                if i not in claimed and t.dtype == wanted[s] and same(spec, t):
                    out[s] = i
                    claimed.add(i)
                    break
    return out
