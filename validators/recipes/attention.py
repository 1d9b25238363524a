"""Attention ops replayed as transformers' SDPA path calls ``F.scaled_dot_product_attention``, and eager
attention (:attr:`~opgraph.ir.Attention.eager`) as its kernels: the scores' matmul, each recorded pass
over the scores in order, the values' matmul (:func:`_eager_case`).

Mirrors ``transformers.integrations.sdpa_attention``: no mask and ``is_causal=True`` for a causal
prefill whose queries cover all keys; no mask for a one-token decode; an explicit bottom-right
causal mask otherwise (chunked prefill, sliding windows). GQA uses ``enable_gqa`` when there is no
mask (torch 2.5+), packs the query groups for a one-token decode with a mask, and otherwise expands
the key/value heads before the call, as ``repeat_kv`` does (the expansion is a separate op in the
graph, so it is made outside the timed call).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from opgraph.ir import Attention, TensorSpec
from validators.inputs import Domain, DomainKind, causal_mask, make_tensor, torch_dtype
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe

if TYPE_CHECKING:
    import torch


def _sdpa_has_gqa() -> bool:
    import torch.nn.functional as F

    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: torch 2.5+ documents enable_gqa
        return True


@register_recipe(Attention)
class AttentionRecipe(Recipe[Attention]):
    """Replays :class:`~opgraph.ir.Attention` from its typed fields (or its recorded q/k/v layouts)."""

    name = "attention"

    def build(self, op: Attention, ctx: BuildContext) -> Case:
        import torch
        import torch.nn.functional as F

        if op.math:
            return _math_case(op, ctx)
        if op.eager is not None:
            return _eager_case(op, ctx)
        b, h, kvh, d, dv = op.batch, op.heads, op.kv_heads, op.head_dim, op.dv
        four_d = [t for t in op.inputs if len(t.shape) == 4 and t.dtype.is_float]
        if len(four_d) >= 3 and four_d[0].shape[-2] == op.q_len:
            q_spec, k_spec, v_spec = four_d[:3]
        else:
            # transformers' layouts: q is a transposed view of the projection ([b, s, h, d] memory),
            # k and v come out of the KV cache contiguous.
            q_spec = TensorSpec(shape=(b, h, op.q_len, d), dtype=op.dtype, strides=(op.q_len * h * d, d, h * d, 1))
            k_spec = TensorSpec(shape=(b, kvh, op.kv_len, d), dtype=op.dtype)
            v_spec = TensorSpec(shape=(b, kvh, op.kv_len, dv), dtype=op.dtype)
        q = make_tensor(q_spec, ctx.device, ctx.gen)
        k = make_tensor(k_spec, ctx.device, ctx.gen)
        v = make_tensor(v_spec, ctx.device, ctx.gen)

        window_hides = op.window is not None and op.window < op.kv_len
        need_mask = op.causal and (window_hides or (op.q_len not in (1, op.kv_len)))
        mask_spec = next(
            (
                t
                for t in op.inputs
                if len(t.shape) >= 2 and t.shape[-2:] == (op.q_len, op.kv_len) and t not in four_d[:3]
            ),
            None,
        )
        mask: torch.Tensor | None = None
        if need_mask or (mask_spec is not None and op.causal):
            spec = mask_spec or TensorSpec(shape=(b, 1, op.q_len, op.kv_len), dtype="bool")
            mask = make_tensor(spec, ctx.device, ctx.gen, Domain(DomainKind.CAUSAL_MASK, window=op.window))
        elif window_hides or (op.q_len == 1 and op.window_full):
            # a decode whose keys fill its window gets a mask from transformers (a non-causal window, rare:
            # one too)
            mask = causal_mask(op.q_len, op.kv_len, device=ctx.device, dtype=torch.bool, window=op.window)
        is_causal = op.causal and mask is None and op.q_len > 1
        groups = q.shape[1] // k.shape[1] if k.shape[1] else 1
        kwargs: dict[str, Any] = {}
        pack = False
        if groups > 1:
            if mask is None and d == dv and d <= 256 and _sdpa_has_gqa():
                kwargs["enable_gqa"] = True
            elif op.q_len == 1:
                pack = True
            else:
                k = k[:, :, None].expand(b, k.shape[1], groups, *k.shape[2:]).reshape(b, -1, *k.shape[2:])
                v = v[:, :, None].expand(b, v.shape[1], groups, *v.shape[2:]).reshape(b, -1, *v.shape[2:])
        scale = d**-0.5
        note = "sdpa " + ", ".join(
            x
            for x in (
                "is_causal" if is_causal else "",
                "bool mask" if mask is not None else "",
                "enable_gqa" if kwargs else "",
                "packed gqa" if pack else "",
            )
            if x
        )

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            qq, kk, vv, mm = inputs
            if pack:
                qq = qq.reshape(qq.shape[0], qq.shape[1] // groups, groups, qq.shape[-1])
            out = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=mm, dropout_p=0.0, is_causal=is_causal, scale=scale, **kwargs
            )
            if pack:
                out = out.reshape(out.shape[0], -1, 1, out.shape[-1])
            return out

        return Case(inputs=(q, k, v, mask), run=run, note=note.strip())


def _math_case(op: Attention, ctx: BuildContext) -> Case:
    """A call that SDPA runs on its math path (:attr:`~opgraph.ir.Attention.math`), made as the model makes it:
    keys and values of ``kv_heads`` heads under queries of ``heads`` (no ``enable_gqa``), and the boolean mask
    the model passed when the math path adds one; SDPA then picks its math path itself."""
    import torch
    import torch.nn.functional as F

    b, h, kvh = op.batch, op.heads, op.kv_heads
    q = make_tensor(TensorSpec(shape=(b, h, op.q_len, op.head_dim), dtype=op.dtype), ctx.device, ctx.gen)
    k = make_tensor(TensorSpec(shape=(b, kvh, op.kv_len, op.head_dim), dtype=op.dtype), ctx.device, ctx.gen)
    v = make_tensor(TensorSpec(shape=(b, kvh, op.kv_len, op.dv), dtype=op.dtype), ctx.device, ctx.gen)
    masked = any(p.fn == "add" for p in op.eager or ())
    mask = (
        causal_mask(op.q_len, op.kv_len, device=ctx.device, dtype=torch.bool, window=op.window).expand(
            b, 1, op.q_len, op.kv_len
        )
        if masked
        else None
    )

    def run(inputs: tuple[Any, ...], reference: bool) -> Any:
        qq, kk, vv, mm = inputs
        return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mm)

    note = f"sdpa math path: {h} heads over {kvh}{', bool mask' if masked else ''}"
    return Case(inputs=(q, k, v, mask), run=run, note=note)


def _eager_case(op: Attention, ctx: BuildContext) -> Case:
    """Eager attention as transformers' eager paths run it, one kernel per recorded pass: ``q @ k^T``, then
    each pass over the scores (a scale, an additive causal mask, casts, a softmax, and a sinks column:
    ``cat``, row ``max``, ``sub``, softmax, the column sliced off), then ``@ v`` (keys and values with
    every query head: the graph's ``repeat_kv`` copies made them). With an ``addend`` pass the scores are
    BLOOM's ``baddbmm`` of an alibi bias, scaled in the call."""
    import torch

    from opgraph.ir import OpKind

    b, h, q_len, kv, d = op.batch, op.heads, op.q_len, op.kv_len, op.head_dim
    q = make_tensor(TensorSpec(shape=(b, h, q_len, d), dtype=op.dtype), ctx.device, ctx.gen)
    k = make_tensor(TensorSpec(shape=(b, h, kv, d), dtype=op.dtype), ctx.device, ctx.gen)
    v = make_tensor(TensorSpec(shape=(b, h, kv, op.dv), dtype=op.dtype), ctx.device, ctx.gen)
    dtype = torch_dtype(op.dtype)
    keep = causal_mask(q_len, kv, device=ctx.device, dtype=torch.bool, window=op.window)
    mask = torch.zeros(b, 1, q_len, kv, device=ctx.device, dtype=dtype).masked_fill(~keep, float("-inf"))
    sinks = make_tensor(TensorSpec(shape=(b, h, q_len, 1), dtype=op.dtype), ctx.device, ctx.gen)
    alibi = make_tensor(TensorSpec(shape=(b * h, 1, kv), dtype=op.dtype), ctx.device, ctx.gen)
    passes = [p for p in op.eager or () if not p.addend]
    addend = len(passes) < len(op.eager or ())
    scale = d**-0.5

    def run(inputs: tuple[Any, ...], reference: bool) -> Any:
        qq, kk, vv, mm, ss, aa = inputs
        if addend:  # BLOOM's baddbmm(alibi, q, k^T): the alibi copied into the scores, the matmul added on
            x = torch.baddbmm(aa, qq.flatten(0, 1), kk.flatten(0, 1).transpose(1, 2), alpha=scale).view(b, h, q_len, kv)
        else:
            x = torch.matmul(qq, kk.transpose(2, 3))
        row = None
        sunk = False
        for p in passes:
            to = torch.float64 if reference else torch_dtype(p.dtype)
            if p.kind is OpKind.SOFTMAX:
                # taken in ``to`` as the model asks: half scores to float32 is one CUDA kernel (half_to_float)
                x = torch.softmax(x, dim=-1, dtype=to)
            elif p.kind is OpKind.REDUCTION:
                row = x.amax(dim=-1, keepdim=True)
            elif p.fn == "cat":
                x, sunk = torch.cat([x, ss.to(x.dtype).expand(*x.shape[:-1], 1)], dim=-1), True
            elif p.kind is OpKind.MEMORY:  # a cast (its dtype the one it reads): to float32 or back
                x = x if reference else x.to(torch.float32 if x.dtype != torch.float32 else dtype)
            elif p.fn == "sub" and row is not None:
                x = x - row
            elif p.fn in ("add", "masked_fill", "where"):
                x = x + (mm if not sunk else torch.nn.functional.pad(mm, (0, 1))).to(x.dtype)
            elif p.fn == "tanh":  # a soft cap's
                x = torch.tanh(x)
            else:  # mul, div and any other pass: a scale
                x = x * scale
        if sunk:
            x = x[..., :-1]
        return torch.matmul(x.to(vv.dtype), vv)

    note = f"eager: {'baddbmm' if addend else 'q @ k^T'}, " + ", ".join(p.fn for p in passes) + ", @ v"
    return Case(inputs=(q, k, v, mask, sinks, alibi), run=run, note=note)
