"""The committed 2-GPU replay speedup (issue 21), recomputed from the replayed results' timestamps.

``benchmarks/gpu/replay_speedup.sh`` replayed one graph's configs on one H100 and under torchrun on
two; the first attempt was cut by the device's time limit, so both runs are partial. Over the configs
both runs finished (the most expensive ones: both replay in the same cost order), the time from each
run's first finished config to its last common one gives the replay-only speedup.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from tests.conftest import REPO

DATA = REPO / "benchmarks" / "results" / "gpu" / "h100x2" / "replay_speedup"


def _results(*names: str) -> list[dict[str, object]]:
    return [json.loads(line) for n in names for line in (DATA / n).read_text().splitlines() if line.strip()]


def _t(r: dict[str, object]) -> float:
    return datetime.fromisoformat(str(r["created"])).timestamp()


def replay_speedup(one: list[dict[str, object]], two: list[dict[str, object]]) -> tuple[int, float, float]:
    """(common configs, seconds per config on one GPU, on two) between each run's first and last
    result among the configs both finished; the first result of each run is its time origin."""
    common = {r["key"] for r in one} & {r["key"] for r in two}
    spans = []
    for run in (one, two):
        first = min(_t(r) for r in run)
        done = [r for r in run if r["key"] in common or _t(r) <= max(_t(x) for x in run if x["key"] in common)]
        spans.append((max(_t(r) for r in run if r["key"] in common) - first) / (len(done) - 1))
    return len(common), spans[0], spans[1]


def test_replay_speedup_helper_on_synthetic_results() -> None:
    def r(key: str, second: int) -> dict[str, object]:
        return {"key": key, "created": f"2026-01-01T00:00:{second:02d}+00:00"}

    one = [r("a", 0), r("b", 10), r("c", 20), r("d", 30)]
    two = [r("a", 0), r("b", 0), r("c", 5), r("d", 5), r("e", 9)]
    n, per_one, per_two = replay_speedup(one, two)
    assert (n, per_one) == (4, 10.0)
    assert per_two == pytest.approx(5 / 3)  # e finished after the last common config: not counted


@pytest.mark.skipif(not (DATA / "replay_1gpu.jsonl").is_file(), reason="the 2 x H100 replay run is not here")
def test_two_gpus_replay_the_same_configs_at_least_1_8x_faster() -> None:
    one = _results("replay_1gpu.jsonl")
    two = _results("replay_2gpu.rank0.jsonl", "replay_2gpu.rank1.jsonl")
    assert {r["rank"] for r in two} == {0, 1} and all(r["status"] == "ok" for r in one + two)
    n, per_one, per_two = replay_speedup(one, two)
    assert n == 26
    assert per_one / per_two >= 1.8
    assert round(per_one, 2) == 7.19 and round(per_two, 2) == 3.92  # the README's figures
