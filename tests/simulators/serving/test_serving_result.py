"""Records and the summary of a served workload, computed by hand."""

from __future__ import annotations

import pytest

from simulators.serving import Request, RequestRecord, summarize


def test_served_record_keeps_the_request_and_derives_its_latencies() -> None:
    req = Request(id=3, arrival_s=1.0, prompt_tokens=8, output_tokens=5)
    rec = RequestRecord.served(req, admitted_s=1.5, first_token_s=2.0, finished_s=3.0)
    assert (rec.id, rec.arrival_s, rec.prompt_tokens, rec.output_tokens) == (3, 1.0, 8, 5)
    assert (rec.admitted_s, rec.first_token_s, rec.finished_s) == (1.5, 2.0, 3.0)
    # 1 s to the first token, 4 more tokens over the next second, 2 s in all.
    assert (rec.ttft_ms, rec.tpot_ms, rec.e2e_ms) == pytest.approx((1000.0, 250.0, 2000.0))


def test_one_token_output_has_no_time_per_output_token() -> None:
    req = Request(id=0, arrival_s=0.0, prompt_tokens=4, output_tokens=1)
    assert RequestRecord.served(req, 0.0, 0.5, 0.5).tpot_ms is None


def test_summary_throughputs_are_per_second_of_makespan() -> None:
    a = RequestRecord.served(Request(id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=3), 0.0, 1.0, 2.0)
    b = RequestRecord.served(Request(id=1, arrival_s=1.0, prompt_tokens=20, output_tokens=1), 1.0, 4.0, 4.0)
    s = summarize([b, a], dropped=2, steps=7, step_shapes_simulated=5, peak_kv_tokens=30, kv_bytes_per_token=8)
    assert (s.completed, s.dropped, s.steps, s.step_shapes_simulated) == (2, 2, 7, 5)
    assert s.makespan_s == 4.0
    assert (s.output_tokens_per_s, s.total_tokens_per_s, s.requests_per_s) == pytest.approx((1.0, 8.5, 0.5))
    assert (s.peak_kv_tokens, s.peak_kv_bytes) == (30, 240)
    assert s.tpot_ms.count == 1  # the one-token request has no time per output token
    assert s.e2e_ms.max == pytest.approx(3000.0)


def test_summary_of_nothing_served_is_all_zero() -> None:
    s = summarize([], dropped=1, steps=0, step_shapes_simulated=0, peak_kv_tokens=0, kv_bytes_per_token=2)
    assert (s.completed, s.makespan_s, s.requests_per_s, s.ttft_ms.count) == (0, 0.0, 0.0, 0)
