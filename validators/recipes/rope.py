"""Rotary embeddings replayed as transformers' ``apply_rotary_pos_emb`` (``x*cos + rotate_half(x)*sin``)."""

from __future__ import annotations

from typing import Any

from opgraph.ir import Rope, TensorSpec
from validators.inputs import make_tensor, torch_dtype
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe

ROPE_THETA = 500000.0


@register_recipe(Rope)
class RopeRecipe(Recipe[Rope]):
    """Rotates q (and k, when the op's inputs hold both) with real cos/sin tables of valid positions."""

    name = "rope"

    def build(self, op: Rope, ctx: BuildContext) -> Case:
        import torch

        rd = op.rotary_dim or op.head_dim
        floats4 = [t for t in op.inputs if len(t.shape) == 4 and t.dtype.is_float]
        # Recorded q/k ([b, h, s, d], whole heads or their rotated slice) and cos/sin ([b, 1, s, rd]),
        # where they agree with the fields; otherwise built from the fields.
        x_specs = [t for t in floats4 if (t.shape[1] > 1 or op.heads == 1) and t.shape[-1] in (rd, op.head_dim)][:2]
        table_specs = [t for t in floats4 if t not in x_specs and t.shape[1] == 1 and t.shape[-1] == rd][:2]
        if x_specs:
            # A recorded rotated slice (partial rotary) replays with its untouched rest, as the model does.
            xs = [make_tensor(_whole_heads(t, op.head_dim), ctx.device, ctx.gen) for t in x_specs]
            batch, seq = x_specs[0].shape[0], x_specs[0].shape[2]
        else:
            # q_proj(x).view(b, s, h, d).transpose(1, 2): a transposed view, as in the model.
            seq, h, d = max(op.tokens, 1), op.heads, op.head_dim
            spec = TensorSpec(shape=(1, h, seq, d), dtype=op.dtype, strides=(seq * h * d, d, h * d, 1))
            xs = [make_tensor(spec, ctx.device, ctx.gen)]
            batch = 1
        if any(t.shape[0] not in (1, batch) or t.shape[2] != seq for t in table_specs):
            table_specs = []
        dtype = torch_dtype(op.dtype)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, rd, 2, device=ctx.device, dtype=torch.float32) / rd))
        pos = torch.arange(seq, device=ctx.device, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        if len(table_specs) == 2:
            # Recorded cos/sin (already unsqueezed to [b, 1, s, d]): real values in their layout.
            cos = make_tensor(table_specs[0], ctx.device, ctx.gen)
            sin = make_tensor(table_specs[1], ctx.device, ctx.gen)
            cos.copy_(emb.cos().to(cos.dtype).expand(cos.shape))
            sin.copy_(emb.sin().to(sin.dtype).expand(sin.shape))
        else:
            cos = emb.cos().to(dtype).expand(batch, seq, rd).unsqueeze(1)
            sin = emb.sin().to(dtype).expand(batch, seq, rd).unsqueeze(1)

        def rotate_half(x: Any) -> Any:
            x1 = x[..., : x.shape[-1] // 2]
            x2 = x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            c, s, *tensors = inputs
            outs = []
            for x in tensors:
                if rd < x.shape[-1]:
                    x_rot, x_pass = x[..., :rd], x[..., rd:]
                    outs.append(torch.cat(((x_rot * c) + (rotate_half(x_rot) * s), x_pass), dim=-1))
                else:
                    # tables wider than x (OLMo 2's float32 ones): computed in their dtype, cast back as the
                    # model does (``q_embed.to(q_type)``); a no-op otherwise
                    outs.append(((x * c) + (rotate_half(x) * s)).to(x.dtype))
            return tuple(outs)

        return Case(inputs=(cos, sin, *xs), run=run, note="HF apply_rotary_pos_emb")


def _whole_heads(spec: TensorSpec, head_dim: int) -> TensorSpec:
    """``spec`` widened to whole heads of ``head_dim`` where it is the rotated slice of each head.

    A strided slice keeps its strides (they are the whole tensor's); a contiguous one becomes a
    contiguous tensor of whole heads.
    """
    if spec.shape[-1] >= head_dim:
        return spec
    return spec.model_copy(update={"shape": (*spec.shape[:-1], head_dim)})
