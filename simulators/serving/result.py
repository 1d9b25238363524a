"""The typed result of a served-workload simulation: per request, per step, percentiles, throughput."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from opgraph.ir.tensor import FrozenModel
from simulators.serving.requests import Request

__all__ = [
    "DroppedRequest",
    "Percentiles",
    "RequestRecord",
    "ServingResult",
    "ServingSettings",
    "ServingSummary",
    "StepRecord",
    "percentiles",
    "summarize",
]


class Percentiles(FrozenModel):
    """Distribution of one latency in milliseconds (linear interpolation between ranks)."""

    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    count: int


def percentiles(values: list[float]) -> Percentiles:
    """Percentiles of ``values`` (all 0 when empty).

    >>> percentiles([1.0, 2.0, 3.0, 4.0]).p50
    2.5
    """
    if not values:
        return Percentiles(p50=0.0, p90=0.0, p99=0.0, mean=0.0, max=0.0, count=0)
    xs = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return Percentiles(p50=q(0.5), p90=q(0.9), p99=q(0.99), mean=sum(xs) / len(xs), max=xs[-1], count=len(xs))


class RequestRecord(FrozenModel):
    """What happened to one served request (times in seconds from the start)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_s: float
    """When the scheduler admitted it (reserved its KV cache)."""
    first_token_s: float
    """When its prefill finished (the first output token)."""
    finished_s: float
    """When its last token came out."""
    ttft_ms: float
    """Time to first token: first token minus arrival."""
    tpot_ms: float | None
    """Time per output token after the first; ``None`` for one-token outputs."""
    e2e_ms: float
    """End-to-end latency: finish minus arrival."""

    @classmethod
    def served(cls, request: Request, admitted_s: float, first_token_s: float, finished_s: float) -> RequestRecord:
        """The record of ``request`` served at these times (the request's own fields, and its latencies)."""
        n = request.output_tokens
        return cls(
            **request.model_dump(),
            admitted_s=admitted_s,
            first_token_s=first_token_s,
            finished_s=finished_s,
            ttft_ms=(first_token_s - request.arrival_s) * 1e3,
            tpot_ms=(finished_s - first_token_s) * 1e3 / (n - 1) if n > 1 else None,
            e2e_ms=(finished_s - request.arrival_s) * 1e3,
        )


class DroppedRequest(FrozenModel):
    """A request the simulation could not serve, and why."""

    id: int
    reason: str


class StepRecord(FrozenModel):
    """One step of the server."""

    index: int
    start_s: float
    dur_us: float
    kind: str
    """``prefill``, ``decode`` or ``mixed``."""
    prefill_tokens: int
    """Prompt tokens processed."""
    decode_batch: int
    """Sequences decoded (one token each)."""
    requests: tuple[int, ...]
    """Ids of the requests in the step."""
    kv_used_tokens: int
    """Tokens in the KV cache after the step."""
    kv_reserved_tokens: int
    """Tokens reserved by admitted requests after the step."""
    key: str
    """The bucketed shape whose simulation priced the step."""


class ServingSettings(FrozenModel):
    """What was simulated."""

    model: str = ""
    hardware: str = ""
    cost_model: str = ""
    tp: int = 1
    scheduler: str
    max_batch: int
    token_budget: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    admission: str = "reserve prompt + output tokens at admission (FCFS, waits when full; no preemption)"
    bucketing: str = (
        "sizes rounded up to 16 buckets per octave above 16 (<= 6.25% per size); decodes by count and mean kv"
    )


class ServingSummary(FrozenModel):
    """Headline numbers."""

    completed: int
    dropped: int
    makespan_s: float
    """From time 0 to the last token."""
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    output_tokens_per_s: float
    total_tokens_per_s: float
    """Prompt plus output tokens per second."""
    requests_per_s: float
    steps: int
    step_shapes_simulated: int
    """Distinct bucketed step shapes whose graphs were simulated."""
    peak_kv_tokens: int
    peak_kv_bytes: int


def summarize(
    records: Sequence[RequestRecord],
    *,
    dropped: int,
    steps: int,
    step_shapes_simulated: int,
    peak_kv_tokens: int,
    kv_bytes_per_token: int,
) -> ServingSummary:
    """The headline numbers of a run from its served ``records`` (any order) and its counts.

    The makespan runs to the last token; throughputs are per second of it (0 when nothing was served).
    """
    makespan = max((r.finished_s for r in records), default=0.0)
    out_tokens = sum(r.output_tokens for r in records)
    all_tokens = out_tokens + sum(r.prompt_tokens for r in records)
    return ServingSummary(
        completed=len(records),
        dropped=dropped,
        makespan_s=makespan,
        ttft_ms=percentiles([r.ttft_ms for r in records]),
        tpot_ms=percentiles([r.tpot_ms for r in records if r.tpot_ms is not None]),
        e2e_ms=percentiles([r.e2e_ms for r in records]),
        output_tokens_per_s=out_tokens / makespan if makespan else 0.0,
        total_tokens_per_s=all_tokens / makespan if makespan else 0.0,
        requests_per_s=len(records) / makespan if makespan else 0.0,
        steps=steps,
        step_shapes_simulated=step_shapes_simulated,
        peak_kv_tokens=peak_kv_tokens,
        peak_kv_bytes=peak_kv_tokens * kv_bytes_per_token,
    )


class ServingResult(FrozenModel):
    """A served-workload simulation, saved as JSON (``opgraph serve-sim -o``, a scenario's
    ``serving.result.json``; read one back with ``opgraph.ir.load_model(path, ServingResult)``)."""

    schema_version: Literal[1] = 1
    """Format version; the loader refuses other versions with a clear message."""
    settings: ServingSettings
    summary: ServingSummary
    requests: tuple[RequestRecord, ...]
    dropped: tuple[DroppedRequest, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    notes: tuple[str, ...] = ()
    wall_s: Annotated[float, Field(ge=0)] = 0.0
    """Wall time of the simulation on the machine that ran it."""
