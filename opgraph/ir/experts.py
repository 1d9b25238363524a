"""Expert GEMMs of mixture-of-experts layers as typed data: :class:`ExpertGemm`, the ``expert`` field of a
:class:`~opgraph.ir.Gemm` (which experts implementation runs it, the layer's experts and top-k, which
projection it is).

Cost models and replay read these fields, never the op's ``definition``: the definition
(``moe_grouped_mm_e128_h2048_i768_topk8_down``, as capture and the profile sweep name expert GEMMs) is a
name for users and the key of shipped profiles and tables. Files written before the field existed name
the same facts only in the definition; :func:`legacy_expert` reads them back from it (the legacy path,
run where an op is validated without the field: :func:`opgraph.ir.ops.legacy_facts`).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from opgraph.ir.tensor import FrozenModel

if TYPE_CHECKING:
    from opgraph.ir.ops import Gemm


class ExpertsImpl(str, Enum):
    """How a mixture-of-experts layer runs its experts (transformers' experts implementations, and the
    layouts the profile sweep measures)."""

    GROUPED_MM = "grouped_mm"
    """``torch._grouped_mm``: one grouped kernel per projection over the experts that received rows (or,
    for dtypes without a grouped kernel, torch's fallback of one ``mm`` per expert from one call)."""
    BATCHED_MM = "batched_mm"
    """transformers' ``batched_mm``: each token-expert pair's expert weights gathered, then one ``bmm``
    of the pairs, each token against its own weight copy."""
    BMM = "bmm"
    """One ``bmm`` over the experts, ``[experts, m, k] @ [experts, k, n]``."""
    LOOP = "loop"
    """An eager loop of one GEMM per expert that received rows (transformers' ``eager`` experts)."""

    @classmethod
    def named(cls, name: str) -> ExpertsImpl:
        """The implementation an experts-implementation name says (a model config's
        ``_experts_implementation``, or the name in an expert GEMM's definition): any name but
        ``grouped_mm``, ``batched_mm`` and ``bmm`` runs the experts as a loop (``eager``, ``modelled``).

        >>> ExpertsImpl.named("grouped_mm").value, ExpertsImpl.named("eager").value
        ('grouped_mm', 'loop')
        """
        try:
            return cls(name)
        except ValueError:
            return cls.LOOP


class ExpertPart(str, Enum):
    """Which projection of the experts an expert GEMM computes."""

    GATE_UP = "gate_up"
    """The first projection (gate and up, or up alone for experts without a gate)."""
    DOWN = "down"
    """The second projection, back to the hidden size."""


class ExpertGemm(FrozenModel):
    """What makes a GEMM an expert GEMM of a mixture-of-experts layer (the ``expert`` field of a
    :class:`~opgraph.ir.Gemm`; ``None`` there for a dense GEMM)."""

    impl: ExpertsImpl
    """The layer's experts implementation (that of the layer, not of this one kernel: torch's fallback
    of ``grouped_mm`` runs one ``mm`` per expert, each a ``grouped_mm`` expert GEMM of one group)."""
    experts: Annotated[int, Field(ge=1)]
    """Experts of the layer (all of them, not only those that received rows)."""
    top_k: Annotated[int, Field(ge=1)]
    """Experts each token is routed to."""
    part: ExpertPart
    """Which projection."""


LEGACY_DEFINITION = re.compile(
    r"^moe_(?P<impl>[a-z][a-z_]*?)_e(?P<experts>\d+)_(?:.*_)?topk(?P<top_k>\d+)_(?P<part>gate_up|down)(?=$|[_@])"
)
"""An expert GEMM's definition as capture and the profile sweep write it:
``moe_{impl}_e{experts}_..._topk{top_k}_{part}``, anything after the part (``_t8``, ``@nested``, ``_tp2``)."""


def legacy_expert(definition: str) -> ExpertGemm | None:
    """The :class:`ExpertGemm` an expert GEMM's definition names (:data:`LEGACY_DEFINITION`), ``None`` for
    any other definition: the legacy path, for ops saved or built before the ``expert`` field existed.

    >>> legacy_expert("moe_grouped_mm_e128_h2048_i768_topk8_down@nested")
    ExpertGemm(impl=<ExpertsImpl.GROUPED_MM: 'grouped_mm'>, experts=128, top_k=8, part=<ExpertPart.DOWN: 'down'>)
    >>> legacy_expert("moe_loop_e8_n64_k32_topk2_gate_up").impl.value, legacy_expert("gemm_n64_k32")
    ('loop', None)
    """
    hit = LEGACY_DEFINITION.match(definition)
    if hit is None or int(hit["experts"]) < 1 or int(hit["top_k"]) < 1:
        return None
    return ExpertGemm(
        impl=ExpertsImpl.named(hit["impl"]),
        experts=int(hit["experts"]),
        top_k=int(hit["top_k"]),
        part=ExpertPart(hit["part"]),
    )


GroupedKernel = Literal["grouped_mm", "bmm", "loop"]
"""The kernel family of a grouped or expert GEMM (the profile regime ``gemm:grouped:<family>``)."""


def grouped_kernel(op: Gemm) -> GroupedKernel:
    """How a grouped or expert GEMM runs its experts: ``bmm`` (one batched product, ``batched_mm``'s
    included), ``grouped_mm`` (torch's grouped kernel) or ``loop`` (one GEMM per expert). An expert GEMM
    says so in its ``expert`` field; any other GEMM by the aten op it came from (its ``target``), and a
    grouped GEMM of neither is a loop. The replay recipe and the profile cost model both decide here.

    >>> from opgraph.ir import Gemm
    >>> grouped_kernel(Gemm(id=0, m=8, n=8, k=8, groups=4, target="aten._grouped_mm.default"))
    'grouped_mm'
    >>> expert = ExpertGemm(impl=ExpertsImpl.BATCHED_MM, experts=4, top_k=2, part=ExpertPart.DOWN)
    >>> grouped_kernel(Gemm(id=0, m=1, n=8, k=8, batch=6, definition="renamed", expert=expert))
    'bmm'
    """
    if op.expert is not None:
        impl = op.expert.impl
        if impl in (ExpertsImpl.BMM, ExpertsImpl.BATCHED_MM):
            return "bmm"
        return "grouped_mm" if impl is ExpertsImpl.GROUPED_MM else "loop"
    target = op.target.lower()
    if "bmm" in target:
        return "bmm"
    return "grouped_mm" if "grouped_mm" in target else "loop"
