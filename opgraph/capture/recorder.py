"""The recorder: a ``TorchDispatchMode`` that logs every aten op with shapes, dtypes, scope and data flow.

One :class:`Recorder` owns the state of a recording: the event list, the module-call table filled by
global forward hooks, tensor identities and the data-dependent assumptions made on ``meta``.

Tensor identity follows storage: an op output that shares its storage with an input (a view, a
reshape, ``detach``) keeps the input's id, so views fold away with their dependencies kept; a fresh
output gets a new id; an in-place write gives the written storage a new version id produced by the
writer. Events are plain slotted objects; nothing is validated per event (IR ops are built once, at
the end, by the lowering passes).

A ``TorchFunctionMode`` handles the few functions whose aten decomposition depends on the device
(``scaled_dot_product_attention`` decomposes into matmuls on ``meta`` but is one fused kernel on
cpu/cuda): they are recorded as one composite event, so a graph captured on ``meta`` equals one
captured on a real device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

try:  # a weak reference to a StorageImpl, so a reused address is not mistaken for the old tensor
    from torch.multiprocessing.reductions import StorageWeakRef
except ImportError:  # pragma: no cover - very old or trimmed torch builds

    class StorageWeakRef:  # type: ignore[no-redef]
        """Fallback that never expires (identity by address only)."""

        def __init__(self, storage: Any) -> None:
            self.cdata = storage._cdata

        def expired(self) -> bool:
            return False


from torch.utils._python_dispatch import TorchDispatchMode

from opgraph.capture.moe_model import PLAN_ATTR
from opgraph.ir.dtypes import TORCH_DTYPE_NAMES


class TRef(NamedTuple):
    """A tensor as seen by an event."""

    tid: int
    """Tensor id (a storage version: views share it, an in-place write makes a new one)."""
    shape: tuple[int, ...]
    dtype: str
    """IR dtype name (``bf16``); torch's own name for a type the IR lacks."""
    strides: tuple[int, ...] | None
    """Strides when not contiguous."""


_IR_DTYPES: dict[torch.dtype, str] = {
    getattr(torch, name): dt.value for name, dt in TORCH_DTYPE_NAMES.items() if hasattr(torch, name)
}
"""torch dtypes to IR dtype names, from the one table in :mod:`opgraph.ir.dtypes`."""


# Ops that reveal data on a meta tensor and what is assumed instead.
_SCALAR_ASSUMPTION = (
    ".item()/.tolist() on meta tensors: booleans are assumed True, integers 1, floats 0.0 "
    "(control flow that depends on tensor values follows the common, no-padding path)"
)
_NONZERO_ASSUMPTION = "nonzero/where(cond) on meta tensors: every element is assumed non-zero (largest output)"


def dtype_name(dtype: torch.dtype) -> str:
    """The IR dtype name of a torch dtype (``bf16``); unknown dtypes keep torch's name."""
    return _IR_DTYPES.get(dtype) or str(dtype).removeprefix("torch.")


@dataclass(slots=True)
class ModuleCall:
    """One invocation of an ``nn.Module`` during the recording."""

    scope: str
    """Qualified module path (``model.layers.0.self_attn``)."""
    cls: str
    """Class name of the module."""
    parent: int
    """Index of the enclosing call, -1 at the top."""
    module: Any = None
    """The module itself (kept for passes that read attributes such as ``num_experts``)."""
    state: object = None
    """What the module left for the lowering when this call ended (the ``PLAN_ATTR`` attribute:
    a modelled experts call's :class:`~opgraph.capture.moe_model.ExpertPlan`)."""


@dataclass(slots=True)
class Event:
    """One recorded aten call (or one composite call such as SDPA)."""

    index: int
    target: str
    """``aten.mm.default``."""
    fn: str
    """Short function name (``mm``)."""
    inputs: tuple[TRef, ...]
    """Tensors read, in argument order (what ``{"tensor": i}`` in ``args`` indexes)."""
    outputs: tuple[TRef, ...]
    """Tensors produced (a fresh id, an alias's id, or a new version of a mutated input)."""
    call: int
    """Innermost module call index, -1 outside every module."""
    stage: str | None
    step: int | None
    args: tuple[Any, ...]
    """Encoded positional arguments (see :class:`opgraph.ir.AtenCall`)."""
    kwargs: dict[str, Any]
    alias: bool = False
    """Every output aliases an input and nothing is written: a view or metadata op."""
    mutates: bool = False
    """Writes an input in place."""
    pointwise: bool = False
    """Tagged pointwise by PyTorch."""
    composite: bool = False
    """A composite recorded at the function level (SDPA)."""
    written: tuple[int, ...] = ()
    """Ids of the inputs passed as ``out=`` arguments (``torch.mm(a, b, out=c)``): written, not read."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _FuncInfo:
    target: str
    fn: str
    is_view: bool
    mutated: tuple[int | str, ...]
    pointwise: bool
    outs: tuple[str, ...]
    """Names of the ``out=`` arguments (written, never read)."""


def _func_info(func: Any) -> _FuncInfo:
    schema = func._schema
    mutated: list[int | str] = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is not None and info.is_write:
            mutated.append(arg.name if arg.kwarg_only else i)
    name = str(func)  # aten.mm.default
    parts = name.split(".")
    fn = parts[1] if len(parts) > 2 else parts[-1]
    pointwise = torch.Tag.pointwise in getattr(func, "tags", ())
    outs = tuple(arg.name for arg in schema.arguments if arg.is_out)
    return _FuncInfo(name, fn, bool(getattr(func, "is_view", False)), tuple(mutated), pointwise, outs)


def _tensors_in(value: Any) -> list[Any]:
    """The tensors of an argument: itself, or those of a list or tuple of them."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    return [v for v in values if isinstance(v, torch.Tensor)]


def _encode_float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return {"float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}


class Recorder:
    """State of one recording; use :meth:`recording` (or :func:`opgraph.capture.tracing`) to run it."""

    def __init__(self, *, profile_ranges: bool = False) -> None:
        self.events: list[Event] = []
        self.calls: list[ModuleCall] = []
        self.assumptions: dict[str, None] = {}
        self.stage: str | None = None
        self.step: int | None = None
        self.profile_ranges = profile_ranges
        self._stack: list[int] = []
        self._names: dict[int, str] = {}
        self._mods: list[Any] = []
        self._keys: dict[int, tuple[int, Any]] = {}  # storage address -> (current tensor id, weak ref)
        self._next_tid = 0
        self._suppress = 0
        self._finfo: dict[Any, _FuncInfo] = {}

    @property
    def tensor_count(self) -> int:
        """Tensor ids handed out so far (the next fresh tensor gets this id)."""
        return self._next_tid

    # ----------------------------------------------------------------- names and scopes
    def add_root(self, module: Any, prefix: str = "") -> None:
        """Name every submodule of ``module`` by its qualified path (done lazily for unknown roots)."""
        for name, sub in module.named_modules(prefix=prefix):
            self._names.setdefault(id(sub), name)
            self._mods.append(sub)  # keep ids stable while recording

    def _name_of(self, module: Any) -> str:
        key = id(module)
        name = self._names.get(key)
        if name is None:
            if self._stack:
                parent = self.calls[self._stack[-1]]
                name = ""
                for child_name, child in parent.module.named_children():
                    if child is module:
                        name = f"{parent.scope}.{child_name}" if parent.scope else child_name
                        break
                if not name:
                    name = type(module).__name__
            else:
                name = ""
                self.add_root(module)
            self._names[key] = name
            self._mods.append(module)
        return name

    def _pre_hook(self, module: Any, args: Any) -> None:
        idx = len(self.calls)
        parent = self._stack[-1] if self._stack else -1
        self.calls.append(ModuleCall(self._name_of(module), type(module).__name__, parent, module))
        self._stack.append(idx)

    def _post_hook(self, module: Any, args: Any, output: Any) -> None:
        if self._stack:
            self.calls[self._stack.pop()].state = getattr(module, PLAN_ATTR, None)

    # ----------------------------------------------------------------- tensors
    def _ref(self, t: torch.Tensor) -> TRef:
        storage = t.untyped_storage()
        entry = self._keys.get(storage._cdata)
        # A storage freed and reallocated at the same address is a new tensor, not the old one.
        if entry is None or entry[1].expired():
            return self._fresh(t, storage)
        strides = None if t.is_contiguous() else tuple(t.stride())
        return TRef(entry[0], tuple(t.shape), dtype_name(t.dtype), strides)

    def _fresh(self, t: torch.Tensor, storage: Any = None) -> TRef:
        if storage is None:
            storage = t.untyped_storage()
        tid = self._next_tid
        self._next_tid += 1
        self._keys[storage._cdata] = (tid, StorageWeakRef(storage))  # type: ignore[no-untyped-call]
        strides = None if t.is_contiguous() else tuple(t.stride())
        return TRef(tid, tuple(t.shape), dtype_name(t.dtype), strides)

    def _encode(self, v: Any, tensors: list[torch.Tensor]) -> Any:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return {"tensor": len(tensors) - 1}
        if isinstance(v, (list, tuple)):
            return [self._encode(x, tensors) for x in v]
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return _encode_float(v)
        if isinstance(v, torch.dtype):
            return {"dtype": dtype_name(v)}
        if isinstance(v, torch.device):
            return None
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return str(v)
        return str(v)

    # ----------------------------------------------------------------- events
    def _dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        info = self._finfo.get(func)
        if info is None:
            info = self._finfo[func] = _func_info(func)
        if self._suppress:
            return func(*args, **kwargs)
        stand_in = meta_stand_in(func, args)
        tensors: list[torch.Tensor] = []
        enc_args = tuple(self._encode(a, tensors) for a in args)
        enc_kwargs = {k: self._encode(v, tensors) for k, v in kwargs.items() if k != "device"}
        inputs = tuple(self._ref(t) for t in tensors)
        out_args = {id(t) for name in info.outs for t in _tensors_in(kwargs.get(name))}
        written = tuple(r.tid for t, r in zip(tensors, inputs, strict=True) if id(t) in out_args)
        index = len(self.events)
        if stand_in is not None:
            out, assumption = stand_in
            self.assumptions[assumption] = None
        elif self.profile_ranges:
            with self._range(index):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        in_keys = {t.untyped_storage()._cdata for t in tensors}
        outs: list[torch.Tensor] = []
        if isinstance(out, torch.Tensor):
            outs.append(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    outs.append(o)
                elif isinstance(o, (tuple, list)):
                    outs.extend(x for x in o if isinstance(x, torch.Tensor))
        mutated_keys: set[int] = set()
        if info.mutated:
            for pos in info.mutated:
                m = kwargs.get(pos) if isinstance(pos, str) else (args[pos] if pos < len(args) else None)
                for t in _tensors_in(m):
                    mutated_keys.add(t.untyped_storage()._cdata)
                    self._fresh(t)  # new version, produced by this event
        out_refs: list[TRef] = []
        alias = not mutated_keys and bool(outs)
        if info.fn == "_to_copy" and outs and tensors and outs[0].device != tensors[0].device:
            # Moving a (cpu) constant onto the capture device: on meta this stands for data that a
            # real run creates in place, so it is no op of the model (no kernel on the cpu run either).
            self._append(index, info.target, info.fn, inputs, (self._fresh(outs[0]),), enc_args, enc_kwargs, alias=True)
            return out
        for o in outs:
            key = o.untyped_storage()._cdata
            if key in mutated_keys or key in in_keys:
                out_refs.append(self._ref(o))
            else:
                alias = False
                out_refs.append(self._fresh(o))
        if mutated_keys and not outs:
            out_refs.extend(self._ref(t) for t in tensors if t.untyped_storage()._cdata in mutated_keys)
        self._append(
            index,
            info.target,
            info.fn,
            inputs,
            tuple(out_refs),
            enc_args,
            enc_kwargs,
            alias=alias or info.is_view,
            mutates=bool(mutated_keys),
            pointwise=info.pointwise,
            written=written,
        )
        return out

    def _append(
        self,
        index: int,
        target: str,
        fn: str,
        inputs: tuple[TRef, ...],
        outputs: tuple[TRef, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        alias: bool = False,
        mutates: bool = False,
        pointwise: bool = False,
        composite: bool = False,
        written: tuple[int, ...] = (),
    ) -> None:
        """Log an event in the innermost module call, with the current stage and step."""
        call = self._stack[-1] if self._stack else -1
        self.events.append(
            Event(
                index, target, fn, inputs, outputs, call, self.stage, self.step, args, kwargs,
                alias=alias, mutates=mutates, pointwise=pointwise, composite=composite, written=written,
            )
        )  # fmt: skip

    def _composite(self, name: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record ``func`` as one event named ``name`` (its aten ops are not recorded separately)."""
        tensors: list[torch.Tensor] = []
        enc_args = tuple(self._encode(a, tensors) for a in args)
        enc_kwargs = {k: self._encode(v, tensors) for k, v in kwargs.items()}
        inputs = tuple(self._ref(t) for t in tensors)
        index = len(self.events)
        self._suppress += 1
        try:
            if self.profile_ranges:
                with self._range(index):
                    out = func(*args, **kwargs)
            else:
                out = run_composite(name, func, args, kwargs)
        finally:
            self._suppress -= 1
        self._append(index, f"aten.{name}", name, inputs, (self._fresh(out),), enc_args, enc_kwargs, composite=True)
        return out

    @contextmanager
    def _range(self, index: int) -> Iterator[None]:
        # A profiler range named after the event, so kernels launched inside are attributed to it.
        # The range's own bookkeeping ops must not be recorded.
        self._suppress += 1
        try:
            rf = torch.profiler.record_function(f"opgraph_ev{index}")
            rf.__enter__()  # type: ignore[no-untyped-call]
        finally:
            self._suppress -= 1
        try:
            yield
        finally:
            self._suppress += 1
            try:
                rf.__exit__(None, None, None)
            finally:
                self._suppress -= 1

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Record what runs inside as if it ran in a module called ``name`` (e.g. the sampler)."""
        idx = len(self.calls)
        self.calls.append(ModuleCall(name, name, self._stack[-1] if self._stack else -1, None))
        self._stack.append(idx)
        try:
            yield
        finally:
            self._stack.pop()

    # ----------------------------------------------------------------- context
    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Install the hooks and modes; everything PyTorch runs inside is recorded."""
        import torch.nn.modules.module as mm

        pre = mm.register_module_forward_pre_hook(self._pre_hook)
        post = mm.register_module_forward_hook(self._post_hook, always_call=True)
        fmode = _FunctionMode(self)
        dmode = _DispatchMode(self)
        try:
            with fmode, dmode:
                yield self
        finally:
            pre.remove()
            post.remove()
            self._stack.clear()


def meta_stand_in(func: Any, args: tuple[Any, ...]) -> tuple[Any, str] | None:
    """A stand-in result for an op whose output depends on values a meta tensor does not have, and
    the assumption it makes; ``None`` for every other op (and on real devices)."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "meta":
        return None
    aten = torch.ops.aten
    if func is aten._local_scalar_dense.default:
        t = args[0]
        if t.dtype == torch.bool:
            return True, _SCALAR_ASSUMPTION
        return (0.0 if t.dtype.is_floating_point else 1), _SCALAR_ASSUMPTION
    if func in (aten.nonzero.default, aten.argwhere.default):
        t = args[0]
        return torch.empty((t.numel(), t.dim()), dtype=torch.long, device="meta"), _NONZERO_ASSUMPTION
    return None


def run_composite(name: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The output of composite ``name``: :func:`fast_meta`'s on meta, else what ``func`` returns."""
    out = fast_meta(name, args)
    return func(*args, **kwargs) if out is None else out


def fast_meta(name: str, args: tuple[Any, ...]) -> Any:
    """The output of a composite on meta without running its decomposition."""
    if name != "scaled_dot_product_attention" or len(args) < 3:
        return None
    q, _, v = args[0], args[1], args[2]
    if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)) or q.device.type != "meta":
        return None
    if q.dim() != 4:
        return torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device="meta")
    # Fused kernels (flash on cuda and cpu, efficient) return (b, s, h, d) memory viewed as (b, h, s, d);
    # matching that layout keeps the copies after attention identical to a real device.
    b, h, s, d = q.shape
    if v.shape[-1] != d:  # no flash kernel for a different value head size: the math path's layout
        return torch.empty((b, h, s, v.shape[-1]), dtype=q.dtype, device="meta")
    return torch.empty((b, s, h, v.shape[-1]), dtype=q.dtype, device="meta").transpose(1, 2)


class _DispatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.recorder._dispatch(func, tuple(args), kwargs or {})


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.sdpa = torch.nn.functional.scaled_dot_product_attention

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is self.sdpa and not self.recorder._suppress:
            note = sdpa_math_note(tuple(args), kwargs)
            if note is not None:
                self.recorder.assumptions[note] = None
            return self.recorder._composite("scaled_dot_product_attention", func, tuple(args), kwargs)
        return func(*args, **kwargs)


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def sdpa_math_path(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], enable_gqa: bool) -> bool:
    """Whether CUDA runs a 4-d ``scaled_dot_product_attention`` of these query, key and value shapes on its
    math path: the fused kernels (flash, memory-efficient, cuDNN) take keys and values of the queries' batch
    and as many heads (fewer only with ``enable_gqa``, a divisor of the query heads).

    >>> sdpa_math_path((1, 71, 8, 64), (1, 1, 8, 64), (1, 1, 8, 64), False)
    True
    >>> sdpa_math_path((1, 32, 8, 64), (1, 8, 8, 64), (1, 8, 8, 64), True)
    False
    """
    if not len(q) == len(k) == len(v) == 4:
        return False
    if not q[0] == k[0] == v[0]:
        return True
    if q[1] == k[1] == v[1]:
        return False
    return not (enable_gqa and k[1] == v[1] and q[1] % k[1] == 0)


def sdpa_math_note(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What to tell about a ``scaled_dot_product_attention`` call that CUDA runs on its math path
    (:func:`sdpa_math_path`), or ``None``: float32 matmuls, a mask add and a softmax over materialised scores.
    Falcon-7B's multi-query attention (71 query heads over one
    key head, no ``enable_gqa``) is one: 6.4 ms a layer at 2048 tokens on an H100, where a fused kernel
    would take 0.09. The lowering prices such a call as that path's kernels (``Attention.math``); the graph
    says why.

    >>> import torch
    >>> q, k = torch.empty(1, 71, 8, 64, device="meta"), torch.empty(1, 1, 8, 64, device="meta")
    >>> gqa = {"enable_gqa": True}
    >>> sdpa_math_note((q, k, k), {}) is not None, sdpa_math_note((q, q, q), {}), sdpa_math_note((q, k, k), gqa)
    (True, None, None)
    """
    call = dict(zip(_SDPA_PARAMS, args, strict=False))
    call.update({k: v for k, v in kwargs.items() if k in _SDPA_PARAMS})
    q, k, v = call.get("query"), call.get("key"), call.get("value")
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    gqa = bool(call.get("enable_gqa"))
    if not sdpa_math_path(tuple(q.shape), tuple(k.shape), tuple(v.shape), gqa):
        return None
    same_batch = q.shape[0] == k.shape[0] == v.shape[0]
    return (
        f"scaled_dot_product_attention of {q.shape[1]} query heads over {k.shape[1]} key/value heads"
        f"{'' if same_batch else ' of another batch'}{' with' if gqa else ' without'} enable_gqa: no fused kernel "
        "takes it, so CUDA runs it on SDPA's math path (inputs cast to float32, float32 matmuls, the mask added "
        "and a safe softmax over the materialised scores); priced as those kernels (Attention.math)"
    )
