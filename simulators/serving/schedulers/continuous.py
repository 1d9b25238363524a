"""Continuous batching (vLLM's default scheduler before chunked prefill, Orca's iteration-level batching).

Each step either prefills newly admitted requests (whole prompts, their sum within the token
budget, up to the batch limit and the KV cache) or, when none can be admitted, decodes every
running request. Prefills take priority, so decodes pause while new prompts come in. A prompt
longer than the token budget can never be scheduled: it is a stated drop.
"""

from __future__ import annotations

from simulators.serving.requests import Request
from simulators.serving.schedulers.base import Scheduler
from simulators.serving.state import Plan, ServingState

__all__ = ["ContinuousBatching"]


class ContinuousBatching(Scheduler):
    name = "continuous"
    description = "iteration-level batching: prefill steps of whole prompts (token budget) first, else decodes"

    def plan(self, state: ServingState) -> Plan:
        budget = state.token_budget
        plan = Plan()
        while state.waiting and state.fits(state.waiting[0]) and state.waiting[0].prompt_tokens <= budget:
            lv = state.admit()
            plan.prefill.append((lv, lv.request.prompt_tokens))
            budget -= lv.request.prompt_tokens
        if plan.prefill:
            return plan
        plan.decode = [lv for lv in state.running if not lv.in_prefill]
        return plan

    def unservable(self, request: Request, state: ServingState) -> str | None:
        if request.prompt_tokens > state.token_budget:
            return (
                f"prompt of {request.prompt_tokens} tokens exceeds the token budget ({state.token_budget}); "
                "continuous batching prefills whole prompts (use --scheduler chunked or a larger --token-budget)"
            )
        return None
