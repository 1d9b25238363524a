"""The request-level loop and its schedulers, on hand-computed timelines with a linear step cost."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.serving import (
    SCHEDULERS,
    Request,
    Scheduler,
    SchedulerError,
    ServingResult,
    StepShape,
    get_scheduler,
    percentiles,
    register_scheduler,
    run_serving,
    serving_timeline,
)


class LinearCost:
    """1 ms a step, plus 0.1 ms a prompt token and 0.01 ms a decode; records the shapes it priced."""

    def __init__(self) -> None:
        self.shapes: list[StepShape] = []

    def step_us(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return 1000.0 + 100.0 * sum(q for q, _ in shape.prefill) + 10.0 * len(shape.decode_kv)


def _req(i: int, t: float, prompt: int, out: int) -> Request:
    return Request(id=i, arrival_s=t, prompt_tokens=prompt, output_tokens=out)


def _run(
    reqs: list[Request], scheduler: str, *, budget: int = 64, batch: int = 8, kv: int = 1000
) -> tuple[ServingResult, LinearCost]:
    cost = LinearCost()
    res = run_serving(
        reqs,
        get_scheduler(scheduler),
        cost,
        max_batch=batch,
        token_budget=budget,
        kv_capacity_tokens=kv,
        kv_bytes_per_token=4,
    )
    return res, cost


def test_continuous_batching_times_by_hand() -> None:
    res, cost = _run([_req(0, 0.0, 8, 3), _req(1, 0.0, 4, 2)], "continuous")
    # Step 1 prefills both (1 + 0.1 x 12 = 2.2 ms); step 2 decodes both (1.02 ms); step 3 decodes A (1.01 ms).
    assert cost.shapes == [
        StepShape(prefill=((8, 8), (4, 4))),
        StepShape(decode_kv=(9, 5)),
        StepShape(decode_kv=(10,)),
    ]
    a, b = res.requests
    assert a.ttft_ms == pytest.approx(2.2) and b.ttft_ms == pytest.approx(2.2)
    assert b.e2e_ms == pytest.approx(2.2 + 1.02)
    assert a.e2e_ms == pytest.approx(2.2 + 1.02 + 1.01)
    assert a.tpot_ms == pytest.approx((1.02 + 1.01) / 2)
    assert res.summary.output_tokens_per_s == pytest.approx(5 / (a.e2e_ms / 1e3))


def test_static_batching_holds_a_new_request_until_the_batch_is_done() -> None:
    reqs = [_req(0, 0.0, 10, 3), _req(1, 0.0001, 10, 1)]
    static, _ = _run(reqs, "static")
    cont, _ = _run(reqs, "continuous")
    # Static: A's batch runs prefill (2 ms) and two decodes (1.01 ms each) before B's prefill starts.
    assert static.requests[1].first_token_s == pytest.approx((2.0 + 2 * 1.01 + 2.0) / 1e3)
    # Continuous: B is prefilled right after A's prefill step.
    assert cont.requests[1].first_token_s == pytest.approx((2.0 + 2.0) / 1e3)


def test_chunked_prefill_splits_prompts_and_mixes_in_decodes() -> None:
    res, cost = _run([_req(0, 0.0, 3, 4), _req(1, 0.0, 10, 1)], "chunked", budget=5)
    assert cost.shapes[:3] == [
        StepShape(prefill=((3, 3), (2, 2))),  # A whole, B's first chunk of 2
        StepShape(prefill=((4, 6),), decode_kv=(4,)),  # A decodes; B's next 4 tokens over its 6 keys
        StepShape(prefill=((4, 10),), decode_kv=(5,)),
    ]
    assert res.requests[1].first_token_s == pytest.approx((1.5 + 1.41 + 1.41) / 1e3)


def test_kv_cache_admission_waits_and_impossible_requests_are_listed_drops() -> None:
    reqs = [_req(0, 0.0, 10, 5), _req(1, 0.0, 10, 5), _req(2, 0.0, 30, 1)]
    res, cost = _run(reqs, "continuous", kv=20)
    assert [d.id for d in res.dropped] == [2]
    assert "31 tokens of KV cache" in res.dropped[0].reason and "20 tokens" in res.dropped[0].reason
    assert res.summary.completed == 2 and res.summary.dropped == 1
    # Each request reserves 15 of the 20 tokens: the second is admitted only when the first finishes.
    assert res.requests[1].admitted_s == pytest.approx(res.requests[0].finished_s)
    assert max(s.kv_reserved_tokens for s in res.steps) <= 20
    assert all(len(s.prefill) <= 1 for s in cost.shapes)


def test_continuous_drops_prompts_above_the_budget_but_chunked_serves_them() -> None:
    reqs = [_req(0, 0.0, 100, 2)]
    cont, _ = _run(reqs, "continuous", budget=64)
    assert [d.id for d in cont.dropped] == [0] and "token budget" in cont.dropped[0].reason
    chunked, _ = _run(reqs, "chunked", budget=64)
    assert chunked.summary.completed == 1 and not chunked.dropped


def test_max_batch_limits_running_requests() -> None:
    reqs = [_req(i, 0.0, 4, 3) for i in range(5)]
    res, cost = _run(reqs, "continuous", batch=2)
    assert max(len(s.prefill) + len(s.decode_kv) for s in cost.shapes) <= 2
    assert res.summary.completed == 5


def test_idle_server_jumps_to_the_next_arrival() -> None:
    res, _ = _run([_req(0, 5.0, 4, 1)], "continuous")
    assert res.requests[0].first_token_s == pytest.approx(5.0 + 1.4e-3)
    assert res.requests[0].ttft_ms == pytest.approx(1.4)


def test_percentiles_match_numpy_linear_interpolation() -> None:
    values = [float(x) for x in np.random.default_rng(3).lognormal(size=101)]
    p = percentiles(values)
    assert (p.p50, p.p90, p.p99) == pytest.approx(tuple(np.percentile(values, [50, 90, 99])))


def test_result_round_trips_and_timeline_has_a_span_per_step() -> None:
    res, _ = _run([_req(i, 0.001 * i, 8, 3) for i in range(4)], "chunked", budget=10)
    assert ServingResult.model_validate_json(res.model_dump_json()) == res
    tl = serving_timeline(res)
    assert sum(1 for s in tl.spans if s.track == "steps") == len(res.steps)
    ends = [s.start_us + s.dur_us for s in tl.spans if s.track == "steps"]
    assert ends[-1] == pytest.approx(res.summary.makespan_s * 1e6)


def test_scheduler_registry_refuses_duplicates_and_unknown_names() -> None:
    assert set(SCHEDULERS) >= {"static", "continuous", "chunked"}
    with pytest.raises(SchedulerError, match="already registered"):
        register_scheduler(type(get_scheduler("static")))
    with pytest.raises(SchedulerError, match="unknown scheduler 'fifo'"):
        get_scheduler("fifo")
    assert issubclass(type(get_scheduler("chunked")), Scheduler)
