"""Step keys of models with sliding windows: the decodes' mean capped keys per window, bucketed.

A decode of ``kv`` keys reads ``min(kv, window)`` in a sliding layer, so a batch's sliding layers read
the mean of the capped lengths; the expected values below are worked by hand from the lengths.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.ir import OpGraph
from simulators.serving import GraphStepCosts, Request, StepKey, StepShape, WindowKv, get_scheduler, run_serving


def test_short_and_long_decodes_read_the_mean_of_their_capped_lengths() -> None:
    # 104 and 10000 keys, window 128: the sliding layer reads (104 + 128) / 2 = 116 keys a decode
    # (on the bucket grid), not min(5052, 128) = 128; the full layers the mean 5052 (bucket 5120).
    key = StepShape(decode_kv=(104, 10000)).key(windows=(128,))
    assert key == StepKey((), 2, 5120, (WindowKv(128, 116),))
    assert key.window_kv == {128: 116}
    # 10 and 10000: (10 + 128) / 2 = 69 keys, in the bucket of 72.
    assert StepShape(decode_kv=(10, 10000)).key(windows=(128,)).window_kv == {128: 72}


def test_each_window_gets_its_own_mean() -> None:
    # 100, 600 and 5000 keys: window 128 reads (100 + 128 + 128) / 3 = 118.7 (bucket 120), window 1024
    # (100 + 600 + 1024) / 3 = 574.7 (bucket 576), full layers 1900 (bucket 1920).
    key = StepShape(decode_kv=(100, 600, 5000)).key(windows=(1024, 128, 128))
    assert key == StepKey((), 3, 1920, (WindowKv(128, 120), WindowKv(1024, 576)))


def test_windows_change_no_key_where_every_decode_is_on_one_side_of_the_window() -> None:
    # All inside the window: the capped lengths are the lengths. All past it: every one reads the window,
    # as the mean does. A model without windows, and prefill parts, are keyed as before.
    for decodes in ((20, 40, 100), (200, 5000), (128, 128, 9000), (2,)):
        shape = StepShape(prefill=((30, 300),), decode_kv=decodes)
        assert shape.key(windows=(128,)) == shape.key() == shape.key(windows=())
    assert StepShape(prefill=((30, 300), (7, 7))).key(windows=(8,)) == StepShape(prefill=((30, 300), (7, 7))).key()


def test_mixes_with_equal_buckets_share_a_key() -> None:
    # The capped means 114.5 and 116 fall in one bucket (116), the plain means are equal: one memo entry.
    a, b = StepShape(decode_kv=(101, 10003)), StepShape(decode_kv=(104, 10000))
    assert a.key(windows=(128,)) == b.key(windows=(128,))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(2, 20000), min_size=1, max_size=64),
    st.lists(st.integers(2, 4096), min_size=1, max_size=3),
)
def test_window_keys_cover_the_keys_read_and_never_exceed_what_the_mean_implies(
    decodes: list[int], windows: list[int]
) -> None:
    key = StepShape(decode_kv=tuple(decodes)).key(windows=windows)
    given_kv = key.window_kv
    assert set(given_kv) <= set(windows)
    for w in set(windows):
        read = sum(min(kv, w) for kv in decodes) / len(decodes)  # what the sliding layer really reads
        keys = given_kv.get(w, min(key.decode_kv, w))  # what it is priced at
        assert read <= keys <= min(w, (read + 1) * 17 / 16)  # rounded up, then to a bucket at most 1/16 up
        assert w not in given_kv or keys < min(key.decode_kv, w)  # named only where it is fewer


def test_graph_costs_memoise_by_the_windowed_key_and_the_engine_records_it() -> None:
    priced: list[StepKey] = []

    def graph_of(key: StepKey) -> OpGraph:
        priced.append(key)
        return OpGraph.model_construct()  # not simulated: the cost below is flat

    costs = GraphStepCosts(graph_of, lambda _: 1000.0, windows=(128, 128))
    assert costs.windows == (128,)
    reqs = [
        Request(id=0, arrival_s=0.0, prompt_tokens=60, output_tokens=3),
        Request(id=1, arrival_s=0.0, prompt_tokens=10000, output_tokens=3),
    ]
    res = run_serving(
        reqs,
        get_scheduler("continuous"),
        costs,
        max_batch=4,
        token_budget=16384,
        kv_capacity_tokens=20000,
        kv_bytes_per_token=2,
    )
    # Decodes over 61 and 10001 keys (mean 5031, bucket 5120), then 62 and 10002: the sliding layer
    # reads (61 + 128) / 2 = 94.5 and 95 keys, both in the bucket of 96. One memo entry for both.
    assert [s.key for s in res.steps] == [
        "prefill 1x60/60 1x10240/10240",
        "decode 2@5120 (w128@96)",
        "decode 2@5120 (w128@96)",
    ]
    assert priced[1] == StepKey((), 2, 5120, (WindowKv(128, 96),)) and len(costs.memo) == 2
