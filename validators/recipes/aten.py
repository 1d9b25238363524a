"""Replay of single-aten ops from their recorded call (``op.call``): exactly what the model ran.

The call's arguments are decoded (``{"tensor": i}`` is input ``i``, ``{"dtype": "bf16"}`` a torch
dtype), inputs are made with the recorded shapes, dtypes and strides, and index-like inputs get
values that are valid for the tensor they index (an out-of-range index on a GPU is a device-side
assert that poisons the whole process, so unknown integer inputs are kept below every dimension).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opgraph.ir import OpBase, TensorSpec
from validators.inputs import (
    BOOL,
    NORMAL,
    POSITIVE,
    Domain,
    DomainKind,
    index,
    make_tensor,
    torch_dtype,
)
from validators.recipes.base import BuildContext, Case, Compare, Recipe
from validators.recipes.registry import register_recipe

if TYPE_CHECKING:
    import torch

RANDOM_OPS = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
        "multinomial", "normal", "uniform", "exponential", "random", "dropout", "native_dropout",
        "cauchy", "geometric", "log_normal", "poisson",
    }
)  # fmt: skip
"""Ops whose outputs are random: timed, not compared."""

UNINITIALISED_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize"})
"""Ops whose outputs are uninitialised memory."""

TIE_OPS = frozenset({"topk", "sort", "argsort", "argmax", "argmin", "max", "min", "mode", "kthvalue", "median"})
"""Ops whose index outputs may differ on ties between the device and the reference."""

POSITIVE_FIRST = frozenset({"rsqrt", "sqrt", "log", "log2", "log10", "reciprocal", "lgamma", "digamma"})
"""Ops whose first input must be positive."""
POSITIVE_SECOND = frozenset({"div", "remainder", "fmod", "floor_divide", "true_divide"})
"""Ops whose second (divisor) input must be non-zero."""

SDPA_OPS = frozenset(
    {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_attention_math",
    }
)
"""Fused attention ops: their mask input is built causal, and CUDA-only ones get a math reference."""


class AtenCallError(Exception):
    """The recorded target is not an op of this torch."""


def split_target(target: str) -> tuple[str, str, str]:
    """``aten.mm.default`` (or ``aten::mm``) to ``("aten", "mm", "default")``."""
    text = target.replace("::", ".")
    parts = text.split(".")
    if len(parts) < 2 or not all(parts):
        raise AtenCallError(f"{target!r} is not of the form namespace.op[.overload]")
    ns, name = parts[0], parts[1]
    overload = parts[2] if len(parts) > 2 else "default"
    return ns, name, overload


def resolve_aten(target: str) -> Any:
    """The ``torch.ops`` overload for ``target``; :class:`AtenCallError` if this torch lacks it."""
    import torch

    ns, name, overload = split_target(target)
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise AtenCallError(f"{target} is not an op of torch {torch.__version__}") from None


def base_name(target: str) -> str:
    """The function name without namespace, overload or in-place underscore (``index_add``)."""
    try:
        name = split_target(target)[1]
    except AtenCallError:
        return target
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name.rstrip("_") or name


def _tensor_index(value: Any) -> int | None:
    if isinstance(value, dict) and set(value) == {"tensor"} and isinstance(value["tensor"], int):
        return int(value["tensor"])
    return None


def _arg(op: OpBase, pos: int, name: str) -> Any:
    call = op.call
    if call is None:
        return None
    if pos < len(call.args):
        return call.args[pos]
    return call.keywords.get(name)


def _int_arg(op: OpBase, pos: int, name: str, default: int = 0) -> int:
    v = _arg(op, pos, name)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else default


def _spec_of(op: OpBase, value: Any) -> TensorSpec | None:
    i = _tensor_index(value)
    return op.inputs[i] if i is not None and i < len(op.inputs) else None


def _dim_size(spec: TensorSpec | None, dim: int) -> int:
    if spec is None or not spec.shape:
        return 1
    return spec.shape[dim % len(spec.shape)]


def input_domains(op: OpBase) -> dict[int, Domain]:
    """Value domains for the op's inputs, by input index, from what each argument means."""
    fn = base_name(op.target)
    doms: dict[int, Domain] = {}

    def put(value: Any, dom: Domain) -> None:
        i = _tensor_index(value)
        if i is not None and i < len(op.inputs) and not op.inputs[i].dtype.is_float:
            doms[i] = dom

    def put_any(value: Any, dom: Domain) -> None:
        i = _tensor_index(value)
        if i is not None and i < len(op.inputs):
            doms[i] = dom

    if fn in ("embedding", "embedding_bag", "_embedding_bag"):
        put(_arg(op, 1, "indices"), index(_dim_size(_spec_of(op, _arg(op, 0, "weight")), 0)))
    elif fn in (
        "index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
        "index_add", "index_copy", "index_fill", "index_reduce",
    ):  # fmt: skip
        src = _spec_of(op, _arg(op, 0, "self"))
        dim = _int_arg(op, 1, "dim")
        bound = _dim_size(src, dim)
        unique = fn in ("scatter", "index_copy")
        put(_arg(op, 2, "index"), index(bound, unique=unique))
    elif fn in ("index", "_unsafe_index", "index_put", "_unsafe_index_put", "_index_put_impl"):
        src = _spec_of(op, _arg(op, 0, "self"))
        indices = _arg(op, 1, "indices")
        accumulate = bool(_arg(op, 3, "accumulate"))
        if isinstance(indices, list):
            for d, v in enumerate(indices):
                s = _spec_of(op, v)
                if s is not None and s.dtype.value == "bool":
                    put(v, BOOL)
                else:
                    put(v, index(_dim_size(src, d), unique=fn != "index" and not accumulate))
    elif fn == "take":
        src = _spec_of(op, _arg(op, 0, "self"))
        put(_arg(op, 1, "index"), index(src.numel if src else 1))
    elif fn == "one_hot":
        classes = _int_arg(op, 1, "num_classes", -1)
        put(_arg(op, 0, "self"), index(classes if classes > 0 else 16))
    elif fn in POSITIVE_FIRST:
        put_any(_arg(op, 0, "self"), POSITIVE)
    elif fn in POSITIVE_SECOND:
        put_any(_arg(op, 1, "other"), POSITIVE)
    elif fn == "pow":
        exponent = _arg(op, 1, "exponent")
        if isinstance(exponent, float) and not exponent.is_integer():
            put_any(_arg(op, 0, "self"), POSITIVE)
    elif fn == "multinomial":
        put_any(_arg(op, 0, "self"), Domain(DomainKind.PROBS))
    elif fn in SDPA_OPS:
        q = _spec_of(op, _arg(op, 0, "query"))
        mask = (
            _arg(op, 3, "attn_mask")
            if fn in ("scaled_dot_product_attention", "_scaled_dot_product_attention_math")
            else None
        )
        if fn in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
            mask = _arg(op, 3, "attn_bias")
        if q is not None and _tensor_index(mask) is not None:
            put_any(mask, Domain(DomainKind.CAUSAL_MASK))
    # Integer inputs no rule covers stay below every dimension of every input, so whatever they
    # index, they stay in range.
    dims = [d for t in op.inputs for d in t.shape if d > 0]
    bound = min([16, *dims]) if dims else 16
    for i, spec in enumerate(op.inputs):
        if i not in doms and not spec.dtype.is_float and spec.dtype.value != "bool":
            doms[i] = index(bound)
    return doms


def _decode(value: Any, tensors: tuple[Any, ...], reference: bool, device: torch.device) -> Any:
    import torch

    if isinstance(value, dict):
        if set(value) == {"tensor"}:
            return tensors[int(value["tensor"])]
        if set(value) == {"dtype"}:
            dt = torch_dtype(str(value["dtype"]))
            return torch.float64 if reference and (dt.is_floating_point or dt.is_complex) else dt
        if set(value) == {"memory_format"}:
            return getattr(torch, str(value["memory_format"]).removeprefix("torch."))
        if set(value) == {"layout"}:
            return getattr(torch, str(value["layout"]).removeprefix("torch."))
        if set(value) == {"device"}:
            return device
        return {k: _decode(v, tensors, reference, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_decode(v, tensors, reference, device) for v in value]
    if isinstance(value, str) and value.startswith("torch."):
        # Memory formats and layouts recorded by name (``torch.contiguous_format``).
        attr = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(attr, torch.memory_format | torch.layout):
            return attr
        if isinstance(attr, torch.dtype):
            return torch.float64 if reference and (attr.is_floating_point or attr.is_complex) else attr
    return value


def _takes_device(fn: Any) -> bool:
    schema = getattr(fn, "_schema", None)
    args = getattr(schema, "arguments", None)
    if args is None:
        return False
    return any(getattr(a, "name", "") == "device" for a in args)


@register_recipe()
class AtenRecipe(Recipe):
    """Runs ``torch.ops.<target>`` with the recorded arguments on synthetic inputs."""

    name = "aten"

    def unsupported(self, op: OpBase) -> str | None:
        if op.call is None:
            return f"{op.target or 'op'}: no recorded aten call"
        try:
            resolve_aten(op.target)
        except AtenCallError as exc:
            return str(exc)
        return None

    def build(self, op: OpBase, ctx: BuildContext) -> Case:
        assert op.call is not None
        fn = resolve_aten(op.target)
        name = base_name(op.target)
        doms = input_domains(op)
        tensors = tuple(make_tensor(spec, ctx.device, ctx.gen, doms.get(i, NORMAL)) for i, spec in enumerate(op.inputs))
        call = op.call
        add_device = _takes_device(fn) and "device" not in call.keywords
        sdpa_reference = name in SDPA_OPS and name != "scaled_dot_product_attention"

        def decoded(inputs: tuple[Any, ...], reference: bool) -> tuple[list[Any], dict[str, Any]]:
            dev = next((t.device for t in inputs if hasattr(t, "device")), ctx.device)
            args = [_decode(v, inputs, reference, dev) for v in call.args]
            kwargs = {k: _decode(v, inputs, reference, dev) for k, v in call.keywords.items()}
            if add_device:
                kwargs["device"] = dev
            return args, kwargs

        # Decoded once: decoding on every call would add the harness's Python to the issue time.
        fast = decoded(tensors, False)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            args, kwargs = fast if inputs is tensors and not reference else decoded(inputs, reference)
            if reference and sdpa_reference:
                return _sdpa_math(name, args, kwargs)
            return fn(*args, **kwargs)

        compare = Compare.ALL
        note = ""
        if name in RANDOM_OPS:
            compare, note = Compare.NONE, "random op: outputs not compared"
        elif name in UNINITIALISED_OPS:
            compare, note = Compare.NONE, "uninitialised output: not compared"
        elif name in TIE_OPS:
            compare, note = Compare.FLOAT_ONLY, "indices not compared (ties)"
        elif sdpa_reference:
            compare, note = Compare.FIRST, "attention output compared with the math SDPA"
        return Case(inputs=tensors, run=run, compare=compare, note=note)


def _sdpa_math(name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The math SDPA, as the float64 reference of a fused attention op (which has no CPU kernel)."""
    import torch.nn.functional as F

    q, k, v = args[:3]
    mask = None
    is_causal = False
    if name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        mask = args[3] if len(args) > 3 else kwargs.get("attn_bias")
        is_causal = bool(args[6] if len(args) > 6 else kwargs.get("is_causal", False))
        scale = kwargs.get("scale")
    else:  # flash: (q, k, v, dropout_p, is_causal, return_debug_mask, scale)
        is_causal = bool(args[4] if len(args) > 4 else kwargs.get("is_causal", False))
        scale = kwargs.get("scale")
    extra = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, **extra)
