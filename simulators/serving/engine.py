"""The request-level loop: arrivals, scheduler steps priced by a step-cost model, per-request latencies.

Time advances step by step (a step's duration is its cost) and jumps to the next arrival when the
server is idle. A request's first token comes out of the step that finishes its prompt; each later
decode step gives one more. Requests that can never be served are dropped before the run, each
with its reason (longer than the model's context window, KV footprint above the cache capacity, or
what the scheduler refuses).

>>> from simulators.serving import Request, run_serving, get_scheduler
>>> class Flat:
...     def step_us(self, shape): return 1000.0 * (1 + len(shape.decode_kv))
>>> reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=8, output_tokens=3)]
>>> r = run_serving(reqs, get_scheduler("continuous"), Flat(), max_batch=4, token_budget=64,
...                 kv_capacity_tokens=100, kv_bytes_per_token=2)
>>> r.requests[0].ttft_ms, r.requests[0].e2e_ms, r.summary.steps
(1.0, 5.0, 3)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opgraph.ir import OpgraphError
from simulators.serving.costs import KeyedStepCosts, StepCostModel
from simulators.serving.requests import Request
from simulators.serving.result import (
    DroppedRequest,
    RequestRecord,
    ServingResult,
    ServingSettings,
    StepRecord,
    summarize,
)
from simulators.serving.schedulers import Scheduler
from simulators.serving.shapes import StepKey, StepShape
from simulators.serving.state import Live, ServingState

__all__ = ["ServingError", "run_serving"]

MAX_STEPS = 50_000_000
"""Guard against a scheduler that never finishes."""


class ServingError(OpgraphError):
    """The serving simulation cannot run (bad limits, a scheduler that stalls)."""


def _key_text(k: StepKey) -> str:
    """``prefill 1x512/4096 + decode 2@5120 (w128@116)``: parts as batch x new tokens / keys, decodes as
    count @ mean keys, and the mean keys read by the sliding layers of a window where they are fewer."""
    parts = " ".join(f"{p.batch}x{p.q_len}/{p.kv_len}" for p in k.prefill)
    dec = f"decode {k.decode_batch}@{k.decode_kv}" if k.decode_batch else ""
    if k.decode_window_kv:
        dec += " (" + ", ".join(f"w{w.window}@{w.kv_len}" for w in k.decode_window_kv) + ")"
    return " + ".join(x for x in (f"prefill {parts}" if parts else "", dec) if x)


def run_serving(
    requests: Sequence[Request],
    scheduler: Scheduler,
    costs: StepCostModel,
    *,
    max_batch: int,
    token_budget: int,
    kv_capacity_tokens: int,
    kv_bytes_per_token: int,
    settings: ServingSettings | None = None,
    record_steps: bool = True,
    max_context_tokens: int | None = None,
) -> ServingResult:
    """Serve ``requests`` (sorted by arrival) with ``scheduler``; each step costs ``costs.step_us``. A step
    record names its bucketed key: ``costs.key`` where the cost model has one, else :meth:`StepShape.key`.

    A request longer than ``max_context_tokens`` (prompt plus output: the model's context window) is
    dropped before the run with its reason, as one whose KV cache never fits."""
    if max_batch < 1:
        raise ServingError(f"max batch must be at least 1 (got {max_batch})", where="--max-batch")
    if token_budget < 1:
        raise ServingError(f"token budget must be at least 1 (got {token_budget})", where="--token-budget")
    wall0 = time.perf_counter()
    key_of: Callable[[StepShape], StepKey] = costs.key if isinstance(costs, KeyedStepCosts) else StepShape.key
    state = ServingState(0.0, max_batch, token_budget, kv_capacity_tokens)
    dropped: list[DroppedRequest] = []
    pending: list[Request] = []
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.id)):
        if max_context_tokens is not None and r.total_tokens > max_context_tokens:
            reason = (
                f"needs {r.total_tokens} positions ({r.prompt_tokens} prompt + {r.output_tokens} output), "
                f"more than the model's context window ({max_context_tokens})"
            )
            dropped.append(DroppedRequest(id=r.id, reason=reason))
        elif r.total_tokens > kv_capacity_tokens:
            reason = (
                f"needs {r.total_tokens} tokens of KV cache ({r.prompt_tokens} prompt + {r.output_tokens} output), "
                f"more than the cache holds ({kv_capacity_tokens} tokens)"
            )
            dropped.append(DroppedRequest(id=r.id, reason=reason))
        elif (why := scheduler.unservable(r, state)) is not None:
            dropped.append(DroppedRequest(id=r.id, reason=why))
        else:
            pending.append(r)
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    n_steps = 0
    next_arrival = 0
    peak_kv = 0
    while next_arrival < len(pending) or state.waiting or state.running:
        while next_arrival < len(pending) and pending[next_arrival].arrival_s <= state.now_s:
            state.waiting.append(pending[next_arrival])
            next_arrival += 1
        plan = scheduler.plan(state)
        if not plan:
            if next_arrival < len(pending):
                state.now_s = max(state.now_s, pending[next_arrival].arrival_s)
                continue
            raise ServingError(
                f"scheduler {scheduler.name!r} planned an empty step with {len(state.running)} running and "
                f"{len(state.waiting)} waiting requests",
                where="scheduler",
            )
        shape = StepShape(
            prefill=tuple((n, lv.prefilled + n) for lv, n in plan.prefill),
            decode_kv=tuple(lv.context for lv in plan.decode),
        )
        dur_us = costs.step_us(shape)
        start = state.now_s
        state.now_s = start + dur_us / 1e6
        done: list[Live] = []
        for lv, n in plan.prefill:
            lv.prefilled += n
            if not lv.in_prefill:
                lv.generated, lv.first_token_s = 1, state.now_s
                if lv.generated >= lv.request.output_tokens:
                    done.append(lv)
        for lv in plan.decode:
            lv.generated += 1
            if lv.generated >= lv.request.output_tokens:
                done.append(lv)
        kv_used = state.kv_used_tokens
        peak_kv = max(peak_kv, kv_used)
        if record_steps:
            key = key_of(shape)
            steps.append(
                StepRecord(
                    index=n_steps,
                    start_s=start,
                    dur_us=dur_us,
                    kind=key.kind,
                    prefill_tokens=sum(n for _, n in plan.prefill),
                    decode_batch=len(plan.decode),
                    requests=tuple(lv.request.id for lv, _ in plan.prefill)
                    + tuple(lv.request.id for lv in plan.decode),
                    kv_used_tokens=kv_used,
                    kv_reserved_tokens=state.kv_reserved_tokens,
                    key=_key_text(key),
                )
            )
        for lv in done:
            state.running.remove(lv)
            state.kv_reserved_tokens -= lv.request.total_tokens
            records.append(_record(lv, state.now_s))
        n_steps += 1
        if n_steps > MAX_STEPS:
            raise ServingError(f"more than {MAX_STEPS} steps", where="scheduler")
    records.sort(key=lambda r: r.id)
    memo = getattr(costs, "memo", None)
    summary = summarize(
        records,
        dropped=len(dropped),
        steps=n_steps,
        step_shapes_simulated=len(memo) if isinstance(memo, dict) else 0,
        peak_kv_tokens=peak_kv,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    settings = settings or ServingSettings(
        scheduler=scheduler.name,
        max_batch=max_batch,
        token_budget=token_budget,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_capacity_tokens=kv_capacity_tokens,
    )
    return ServingResult(
        settings=settings,
        summary=summary,
        requests=tuple(records),
        dropped=tuple(dropped),
        steps=tuple(steps),
        wall_s=time.perf_counter() - wall0,
    )


def _record(lv: Live, now: float) -> RequestRecord:
    first = lv.first_token_s if lv.first_token_s is not None else now
    return RequestRecord.served(lv.request, lv.admitted_s, first, now)
