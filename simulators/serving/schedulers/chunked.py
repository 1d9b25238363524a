"""Chunked prefill (Sarathi-Serve; vLLM V1 and SGLang by default): decodes first, prompt chunks fill the rest.

Each step decodes every running request that has finished its prompt (one token each), then
spends what is left of the token budget on prompt chunks: requests part-way through their prompt
first, then newly admitted ones (FCFS, batch limit, KV cache). Steps mix prefill and decode.
"""

from __future__ import annotations

from simulators.serving.schedulers.base import Scheduler
from simulators.serving.state import Plan, ServingState

__all__ = ["ChunkedPrefill"]


class ChunkedPrefill(Scheduler):
    name = "chunked"
    description = "mixed steps: all decodes, then prompt chunks up to the token budget"

    def plan(self, state: ServingState) -> Plan:
        plan = Plan(decode=[lv for lv in state.running if not lv.in_prefill][: state.token_budget])
        budget = state.token_budget - len(plan.decode)
        for lv in state.running:
            if budget <= 0:
                break
            if lv.in_prefill:
                chunk = min(budget, lv.request.prompt_tokens - lv.prefilled)
                plan.prefill.append((lv, chunk))
                budget -= chunk
        while budget > 0 and state.waiting and state.fits(state.waiting[0]):
            lv = state.admit()
            chunk = min(budget, lv.request.prompt_tokens)
            plan.prefill.append((lv, chunk))
            budget -= chunk
        return plan
