"""What one op config is: the op with its identity stripped, its canonical JSON and its stable hashes.

The one home of config identity, shared by the catalog (:mod:`opgraph.catalog`: :func:`config_hash`,
normalised and versioned, for saved catalogs) and replay (:mod:`validators`: :func:`config_key`, the
exact fields including strides as recorded, the key of results and resume files).

Two ops are the same *config* when they would run the same kernel on the same data layout: same
kind, definition, target, kind fields, tensor shapes, dtypes and strides, and the same non-tensor
call arguments. Where an op sits (id, scope, layer, stage, step) and which tensor ids it touched
are provenance, not config, and are dropped before hashing. FLOP and byte counts are derived cost
annotations, kept on the stored op but left out of the hash.

The typed facts that ops saved before they were fields said in their definition (``issue``,
``Gemm.expert``: :func:`~opgraph.ir.ops.legacy_facts`) are left out of both the key and the hash where
they hold what the definition says, so every op keeps the key and hash it had before those fields
existed (the keys of shipped device profiles among them); an op whose fields say something else than
its definition keys differently.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from opgraph.ir.ops import IDENTITY_FIELDS, OP_TYPES, OpBase, OpKind, legacy_facts, parse_op
from opgraph.ir.tensor import TensorSpec

CONFIG_HASH_VERSION = 1
"""Version of the normalisation rules below; part of every hash, bumped when they change."""

_COST_FIELDS = ("flops", "bytes_read", "bytes_written")
_IDENTITY_DEFAULTS: dict[str, Any] = {**dict.fromkeys(IDENTITY_FIELDS), "id": 0, "scope": ""}


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Row-major strides (in elements) of a contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(1, shape[i + 1])
    return tuple(strides)


def is_contiguous(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int] | None) -> bool:
    """True when ``strides`` is ``None`` or lays ``shape`` out row-major (size-1 dims are free)."""
    if strides is None:
        return True
    expected = contiguous_strides(shape)
    return all(size <= 1 or s == e for size, s, e in zip(shape, strides, expected, strict=True))


def tensor_layout(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int] | None) -> str:
    """A short name for a tensor's memory layout.

    ``contiguous`` (row-major), ``transposed`` (the last two dimensions swapped, as a ``.t()``
    weight), ``broadcast`` (a zero stride, as from ``expand``) or ``strided`` (anything else).
    """
    if is_contiguous(shape, strides):
        return "contiguous"
    assert strides is not None
    if any(s == 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return "broadcast"
    if len(shape) >= 2:
        perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
        p_shape = [shape[i] for i in perm]
        p_strides = [strides[i] for i in perm]
        if is_contiguous(p_shape, p_strides):
            return "transposed"
    return "strided"


def _normalise_tensor(t: dict[str, Any]) -> dict[str, Any]:
    out = dict(t)
    out["id"] = None
    if is_contiguous(out["shape"], out.get("strides")):
        out["strides"] = None
    return out


def config_dict(op: OpBase) -> dict[str, Any]:
    """The op as JSON-ready data with identity fields reset and contiguous strides dropped.

    The result validates back into an op (:func:`normalise_op`) and is what the catalog stores.
    """
    data: dict[str, Any] = op.model_dump(mode="json")
    data.update(_IDENTITY_DEFAULTS)
    data["inputs"] = [_normalise_tensor(t) for t in data.get("inputs", ())]
    data["outputs"] = [_normalise_tensor(t) for t in data.get("outputs", ())]
    return data


def canonical_json(value: object) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 kept, shortest float repr."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


@cache
def _field_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """JSON form of the plain defaults of a model's fields (fields with a default factory left out)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.default is not PydanticUndefined:
            value = info.default
            out[name] = value.value if isinstance(value, Enum) else value
    return out


def _without_defaults(data: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    defaults = _field_defaults(model)
    return {k: v for k, v in data.items() if not (k in defaults and v == defaults[k])}


def _json(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value.value if isinstance(value, Enum) else value


def _facts_against_definition(op_type: type[OpBase], data: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The typed-fact fields of ``data`` (an op's JSON form) that hold what its definition says, and
    those that hold something else."""
    facts = legacy_facts(op_type, str(data.get("definition") or ""))
    said = {k for k, v in facts.items() if k in data and data[k] == _json(v)}
    return said, {k for k in facts if k in data and k not in said}


def hash_config_dict(data: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of a :func:`config_dict`, without its cost fields.

    Fields equal to their declared default are left out, so adding a field with a default to the
    IR does not change the hash of any existing config; so are the typed facts that hold what the
    op's definition says (:func:`~opgraph.ir.ops.legacy_facts`), and those that say something else are
    kept, defaults or not.
    """
    op_type = OP_TYPES[OpKind(data["kind"])]
    said, other = _facts_against_definition(op_type, data)
    keyed = {k: v for k, v in data.items() if k not in _COST_FIELDS and k not in IDENTITY_FIELDS and k not in said}
    keyed = {**_without_defaults(keyed, op_type), **{k: data[k] for k in other}}
    for side in ("inputs", "outputs"):
        if side in keyed:
            keyed[side] = [_without_defaults(t, TensorSpec) for t in keyed[side]]
    payload = canonical_json({"v": CONFIG_HASH_VERSION, "op": keyed})
    return hashlib.sha256(payload.encode()).hexdigest()


def config_hash(op: OpBase) -> str:
    """Stable hash of an op's config: independent of op ids, program order, layer and scope.

    >>> from opgraph.ir import Gemm
    >>> config_hash(Gemm(id=1, m=8, n=16, k=32, layer=3)) == config_hash(Gemm(id=9, m=8, n=16, k=32))
    True
    """
    return hash_config_dict(config_dict(op))


_KEYLESS_WHEN_UNSET: dict[str, object] = {"eager": None, "scalar": False, "masked": False, "math": False}
"""Fields added after keys were saved, left out of :func:`config_key` while they hold their default, so the
ops that lack them keep their keys."""

_KEY_EXCLUDE: dict[str, object] = {
    **dict.fromkeys(IDENTITY_FIELDS, True),
    "inputs": {"__all__": {"id"}},
    "outputs": {"__all__": {"id"}},
}


def config_key(op: OpBase) -> str:
    """A stable 16-hex-digit key of the op's replay config (same config, same key, across runs and graphs).

    Unlike :func:`config_hash` it keeps the op's fields exactly as recorded (strides, cost fields,
    defaults): it keys replay results, resume files and device profiles, whose saved keys must not
    change. The typed facts that hold what the op's definition says are left out (those ops saved
    before they were fields keep their keys: :func:`~opgraph.ir.ops.legacy_facts`).

    >>> from opgraph.ir import Gemm
    >>> config_key(Gemm(id=1, m=8, n=16, k=32, layer=3)) == config_key(Gemm(id=9, m=8, n=16, k=32))
    True
    """
    facts = legacy_facts(type(op), op.definition)
    implied = {k: True for k, v in facts.items() if getattr(op, k) == v}
    implied.update(
        {k: True for k, unset in _KEYLESS_WHEN_UNSET.items() if k in type(op).model_fields and getattr(op, k) == unset}
    )
    blob = op.model_dump_json(exclude={**_KEY_EXCLUDE, **implied})  # type: ignore[arg-type]
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def normalise_op(op: OpBase) -> OpBase:
    """The op as the catalog stores it: id 0, no scope, layer, stage or step, no tensor ids."""
    return parse_op(config_dict(op))


def operation_name(op: OpBase) -> str:
    """The operation an op is an instance of, at the granularity of a sweep test module.

    ``gemm``, ``bmm``, ``grouped_gemm``, ``attention``, ``mla_attention``, ``rmsnorm``,
    ``layernorm``, ``rope``, ``embedding``, the function name of activations, elementwise ops,
    reductions, top-k and memory ops (``silu``, ``add``, ``topk``, ``copy``), ``softmax``,
    ``moe_<fn>`` for routing and the collective's name (``all_reduce``).
    """
    kind = op.kind
    fields = op.__dict__
    if kind is OpKind.GEMM:
        if fields["groups"] > 1:
            return "grouped_gemm"
        return "bmm" if fields["batch"] > 1 else "gemm"
    if kind is OpKind.ATTENTION:
        return "mla_attention" if fields["variant"].value == "mla" else "attention"
    if kind is OpKind.NORM:
        return "rmsnorm" if fields["variant"].value == "rms" else "layernorm"
    if kind is OpKind.MOE_ROUTING:
        return f"moe_{fields['fn']}"
    if kind is OpKind.COLLECTIVE:
        return str(fields["collective"].value)
    if kind in (OpKind.ROPE, OpKind.EMBEDDING, OpKind.SOFTMAX):
        return str(kind.value)
    fn = fields.get("fn") or ""
    if kind is OpKind.OTHER:
        return str(fn or op.target or "other")
    return str(fn or kind.value)


def dtype_signature(op: OpBase) -> str:
    """The dtypes of an op for ids and tables: its compute dtype, plus the others its tensors use.

    ``bf16`` for a plain bf16 op; ``fp8_e4m3+bf16`` when an fp8 GEMM writes bf16.
    """
    seen = [op.dtype.value]
    for t in (*op.inputs, *op.outputs):
        if t.dtype.value not in seen and t.dtype.is_float:
            seen.append(t.dtype.value)
    out_dtype = op.__dict__.get("out_dtype")
    if out_dtype is not None and out_dtype.value not in seen:
        seen.append(out_dtype.value)
    return "+".join(seen)


def size_label(op: OpBase) -> str:
    """The sizes of an op that its definition leaves out (``m2048`` for ``gemm_n4096_k4096``)."""
    f = op.__dict__
    kind = op.kind
    if kind is OpKind.GEMM:
        return f"m{f['m']}"
    if kind is OpKind.ATTENTION:
        return f"b{f['batch']}_q{f['q_len']}_kv{f['kv_len']}"
    if kind in (OpKind.NORM, OpKind.SOFTMAX, OpKind.TOPK):
        return f"r{f['rows']}"
    if kind in (OpKind.ROPE, OpKind.EMBEDDING, OpKind.MOE_ROUTING):
        return f"t{f['tokens']}"
    if kind in (OpKind.ACTIVATION, OpKind.ELEMENTWISE, OpKind.MEMORY):
        if op.definition.endswith(f"_n{f['numel']}"):
            return _shape_label(op)
        return f"n{f['numel']}"
    if kind is OpKind.REDUCTION:
        return f"n{f['numel_in']}"
    if kind is OpKind.COLLECTIVE:
        return ""
    return _shape_label(op)


def _shape_label(op: OpBase) -> str:
    tensors = op.inputs or op.outputs
    if not tensors:
        return ""
    return "x".join(str(d) for d in tensors[0].shape) or "scalar"
