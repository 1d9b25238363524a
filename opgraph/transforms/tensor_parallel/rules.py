"""Which GEMMs are column-, row- or vocab-parallel: scope rules (:data:`DEFAULT_LINEAR_RULES`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from opgraph.ir import OpBase


class ParallelStyle(str, Enum):
    """How a linear layer is split over the ranks."""

    COLUMN = "column"
    """Output features split: ``n / tp``; the output is split, no communication."""
    ROW = "row"
    """Input features split: ``k / tp``; the output is a partial sum (an all-reduce follows)."""
    REPLICATED = "replicated"
    """Every rank computes the whole layer."""
    VOCAB = "vocab"
    """Column-parallel over the (padded) vocabulary, then an all-gather of the logits."""


@dataclass(frozen=True)
class LinearRule:
    """Maps GEMMs to a :class:`ParallelStyle` by module scope (and optionally target).

    ``scope`` and ``target`` are regular expressions searched in the op's ``scope`` and ``target``.
    ``moe_experts`` marks stacked expert GEMMs, which ``expert_parallel=True`` splits by expert
    instead.
    """

    scope: str
    style: ParallelStyle
    target: str | None = None
    moe_experts: bool = False

    def matches(self, op: OpBase) -> bool:
        """Whether the rule applies to ``op``."""
        if not re.search(self.scope, op.scope):
            return False
        return self.target is None or re.search(self.target, op.target) is not None


def _names(*names: str) -> str:
    return r"(?:^|\.)(?:" + "|".join(names) + r")$"


DEFAULT_LINEAR_RULES: tuple[LinearRule, ...] = (
    # Stacked MoE experts (one grouped GEMM per family): gate_up is column, down is row.
    LinearRule(r"(?:^|\.)experts$", ParallelStyle.COLUMN, target=r"gate_up|w13|w1\b|up", moe_experts=True),
    LinearRule(r"(?:^|\.)experts$", ParallelStyle.ROW, target=r"down|w2\b", moe_experts=True),
    # Routers and low-rank (MLA) down-projections: small, replicated (vLLM ReplicatedLinear).
    LinearRule(
        _names("gate", "router", "shared_expert_gate", "q_a_proj", "kv_a_proj_with_mqa", "kv_a_proj"),
        ParallelStyle.REPLICATED,
    ),
    # Column-parallel: attention input projections and MLP up-projections.
    LinearRule(
        _names(
            "q_proj",
            "k_proj",
            "v_proj",
            "qkv_proj",
            "query_key_value",
            "Wqkv",
            "W_pack",
            "c_attn",
            "q_b_proj",
            "kv_b_proj",
            "linear_qkv",
            "gate_proj",
            "up_proj",
            "gate_up_proj",
            "w1",
            "w3",
            "c_fc",
            "fc1",
            "fc_in",
            "dense_h_to_4h",
            "linear_fc1",
        ),
        ParallelStyle.COLUMN,
    ),
    # Row-parallel: attention output projections and MLP down-projections.
    LinearRule(
        _names(
            "o_proj",
            "out_proj",
            "wo",
            "c_proj",
            "down_proj",
            "w2",
            "fc2",
            "fc_out",
            "dense_4h_to_h",
            "linear_proj",
            "linear_fc2",
        ),
        ParallelStyle.ROW,
    ),
    LinearRule(r"(?:^|\.)(?:self_attention|attention|attn)\.dense$", ParallelStyle.ROW),
    # The output head: vocab-parallel (an all-gather of the logits follows).
    LinearRule(_names("lm_head", "embed_out", "output"), ParallelStyle.VOCAB),
)
"""The default rules, most specific first; the first rule that matches decides."""


def linear_style(op: OpBase, rules: Sequence[LinearRule] = DEFAULT_LINEAR_RULES) -> LinearRule | None:
    """The first rule of ``rules`` that matches the GEMM ``op``, or ``None`` (unknown: replicated)."""
    for rule in rules:
        if rule.matches(op):
            return rule
    return None
