"""Static batching: admit a batch, prefill it in one step, decode until every request in it is done.

Requests that arrive meanwhile wait for the whole batch to finish; finished requests leave the
decode batch (no padding is charged).
"""

from __future__ import annotations

from simulators.serving.schedulers.base import Scheduler
from simulators.serving.state import Plan, ServingState

__all__ = ["StaticBatching"]


class StaticBatching(Scheduler):
    name = "static"
    description = "a batch at a time: one prefill of the whole batch, then decodes until all finish"

    def plan(self, state: ServingState) -> Plan:
        if not state.running:
            while state.waiting and state.fits(state.waiting[0]):
                state.admit()
            return Plan(prefill=[(lv, lv.request.prompt_tokens) for lv in state.running])
        return Plan(decode=[lv for lv in state.running if not lv.in_prefill])
