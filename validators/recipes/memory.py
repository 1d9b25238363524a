"""Data movement without a recorded call: copy, cast, fill, cat, index (gather rows), KV-cache writes,
``repeat_kv`` copies and a ``baddbmm``'s ``addend`` (an expanded view copied: the op's input keeps the
expansion's zero stride).

Shapes come from the op's tensors when recorded, else a flat tensor of ``numel`` elements. A KV
cache write with two inputs is a concatenation along the sequence dim when the output grew (what
transformers' ``DynamicCache`` does with ``torch.cat``), else an ``index_copy_`` into a static cache.
"""

from __future__ import annotations

from typing import Any

from opgraph.ir import Memory, TensorSpec
from validators.inputs import index, make_tensor, torch_dtype
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe

FNS = ("copy", "cast", "fill", "zero", "cat", "index", "kv_cache_write", "contiguous", "clone", "repeat_kv", "addend")


def _cat_dim(ins: list[TensorSpec], out: TensorSpec | None) -> int | None:
    """The dim along which ``ins`` concatenate into ``out`` (or differ, without ``out``)."""
    if len(ins) < 2 or any(len(t.shape) != len(ins[0].shape) for t in ins):
        return None
    diff = [d for d in range(len(ins[0].shape)) if len({t.shape[d] for t in ins}) > 1]
    if out is not None and len(out.shape) == len(ins[0].shape):
        grown = [d for d in range(len(out.shape)) if out.shape[d] == sum(t.shape[d] for t in ins)]
        if grown:
            return grown[0]
    return diff[0] if len(diff) == 1 else (len(ins[0].shape) - 2 if len(ins[0].shape) >= 2 else 0)


@register_recipe(Memory)
class MemoryRecipe(Recipe[Memory]):
    """Copies, casts, fills, concatenations, row gathers and KV-cache writes."""

    name = "memory"

    def unsupported(self, op: Memory) -> str | None:
        if op.fn not in FNS:
            return f"{op.target or op.fn}: no replay recipe for memory op {op.fn!r} without a recorded call"
        return None

    def build(self, op: Memory, ctx: BuildContext) -> Case:
        import torch

        flat = TensorSpec(shape=(max(op.numel, 0),), dtype=op.dtype)
        ins = list(op.inputs) or [flat]
        out = op.outputs[0] if op.outputs else None
        fn = op.fn
        if fn in ("cat", "kv_cache_write") and len(ins) >= 2:
            dim = _cat_dim(ins, out)
            xs = [make_tensor(t, ctx.device, ctx.gen) for t in ins]
            grew = out is not None and dim is not None and out.shape[dim] == sum(t.shape[dim] for t in ins)
            if fn == "cat" or grew:
                d = dim if dim is not None else 0

                def run_cat(inputs: tuple[Any, ...], reference: bool) -> Any:
                    return torch.cat(list(inputs), dim=d)

                return Case(inputs=tuple(xs), run=run_cat, note=f"torch.cat(dim={d})")
            d = dim if dim is not None else max(len(ins[0].shape) - 2, 0)
            pos = make_tensor(
                TensorSpec(shape=(ins[1].shape[d],), dtype="int64"),
                ctx.device,
                ctx.gen,
                index(ins[0].shape[d], unique=True),
            )

            def run_write(inputs: tuple[Any, ...], reference: bool) -> Any:
                cache, new, p = inputs
                return cache.index_copy_(d, p, new)

            return Case(inputs=(xs[0], xs[1], pos), run=run_write, note=f"index_copy_ into a static cache (dim {d})")
        if fn == "copy" and op.target == "aten.copy_.default" and len(ins) == 2 and ins[0].shape == ins[1].shape:
            # copy_(self, src): written through the destination's recorded view, read through the source's
            dst_view, src_view = (make_tensor(t, ctx.device, ctx.gen) for t in ins)

            def run_copy_into(inputs: tuple[Any, ...], reference: bool) -> Any:
                return inputs[0].copy_(inputs[1])

            return Case(inputs=(dst_view, src_view), run=run_copy_into, note="copy_ into the recorded view")
        src = make_tensor(ins[0], ctx.device, ctx.gen)
        if fn == "index":
            rows = out.shape[0] if out is not None and out.shape else max(op.numel // max(ins[0].shape[-1], 1), 1)
            idx = make_tensor(
                TensorSpec(shape=(rows,), dtype="int64"),
                ctx.device,
                ctx.gen,
                index(ins[0].shape[0] if ins[0].shape else 1),
            )

            def run_index(inputs: tuple[Any, ...], reference: bool) -> Any:
                return inputs[0].index_select(0, inputs[1])

            return Case(inputs=(src, idx), run=run_index, note="index_select(0)")
        if fn in ("fill", "zero"):

            def run_fill(inputs: tuple[Any, ...], reference: bool) -> Any:
                return inputs[0].zero_()

            return Case(inputs=(src,), run=run_fill, note="zero_")
        if fn == "cast":
            to = torch_dtype(out.dtype) if out is not None else torch.float32

            def run_cast(inputs: tuple[Any, ...], reference: bool) -> Any:
                return inputs[0].to(torch.float64 if reference and to.is_floating_point else to)

            return Case(inputs=(src,), run=run_cast, note=f"to({to})")
        dst_spec = (
            out if out is not None and out.shape == ins[0].shape else TensorSpec(shape=ins[0].shape, dtype=ins[0].dtype)
        )
        dst = make_tensor(dst_spec, ctx.device, ctx.gen)

        def run_copy(inputs: tuple[Any, ...], reference: bool) -> Any:
            return inputs[1].copy_(inputs[0])

        return Case(inputs=(src, dst), run=run_copy, note="copy_")
