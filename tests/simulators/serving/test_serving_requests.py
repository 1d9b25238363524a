"""Request traces and the Poisson generator: parsing, ordering, bad input as one-line errors."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

import pytest

from simulators.serving import LengthDist, WorkloadError, load_trace, poisson_workload


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_jsonl_and_csv_traces_read_the_same_requests_sorted_by_arrival(tmp_path: Path) -> None:
    jsonl = _write(
        tmp_path,
        "t.jsonl",
        '{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 3}\n\n'
        '{"arrival_s": 0.1, "prompt_tokens": 20, "output_tokens": 4}\n',
    )
    csv = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.1,20,4\n")
    for path in (jsonl, csv):
        reqs = load_trace(path)
        assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
            (0, 0.1, 20, 4),
            (1, 0.5, 10, 3),
        ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"arrival_s": -1, "prompt_tokens": 10, "output_tokens": 3}', "arrival_s must be at least 0"),
        ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 3}', "prompt_tokens must be at least 1"),
        ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 0}', "output_tokens must be at least 1"),
        ('{"arrival_s": 0, "prompt_tokens": 5}', "missing output_tokens"),
        ('{"arrival_s": "soon", "prompt_tokens": 5, "output_tokens": 1}', "must be a number"),
        ("[1, 2]", "not a JSON object"),
        ("{oops", "not JSON"),
    ],
)
def test_bad_trace_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}'
    path = _write(tmp_path, "bad.jsonl", good + "\n" + line + "\n")
    with pytest.raises(WorkloadError) as info:
        load_trace(path)
    text = str(info.value)
    assert message in text and f"{path}:2" in text and "\n" not in text


def test_empty_and_missing_traces_are_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no requests"):
        load_trace(_write(tmp_path, "e.jsonl", "\n"))
    with pytest.raises(WorkloadError, match="no such file"):
        load_trace(tmp_path / "missing.jsonl")


def test_poisson_is_seeded_and_has_the_asked_rate() -> None:
    kwargs = {
        "rate": 4.0,
        "num_requests": 4000,
        "prompt_len": LengthDist.parse("10..20"),
        "output_len": LengthDist.parse("exp:50"),
    }
    a = poisson_workload(seed=1, **kwargs)  # type: ignore[arg-type]
    assert a == poisson_workload(seed=1, **kwargs)  # type: ignore[arg-type]
    assert a != poisson_workload(seed=2, **kwargs)  # type: ignore[arg-type]
    gaps = [b.arrival_s - x.arrival_s for x, b in itertools.pairwise(a)]
    # Exponential gaps of mean 1/4 s: the sample mean is within 5 standard errors.
    assert abs(statistics.fmean(gaps) - 0.25) < 5 * 0.25 / math.sqrt(len(gaps))
    assert {r.prompt_tokens for r in a} == set(range(10, 21))
    assert abs(statistics.fmean(r.output_tokens for r in a) - 50) < 5


@pytest.mark.parametrize("text", ["0", "-3", "9..2", "abc", "exp:0"])
def test_bad_lengths_are_refused(text: str) -> None:
    with pytest.raises(WorkloadError, match="bad token length"):
        LengthDist.parse(text, "--prompt-len")


def test_poisson_rejects_non_positive_rate() -> None:
    with pytest.raises(WorkloadError, match="rate must be positive"):
        poisson_workload(rate=0.0, num_requests=3, prompt_len=LengthDist.parse("1"), output_len=LengthDist.parse("1"))


def test_a_csv_row_short_of_columns_names_the_missing_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,1\n0.5,5\n")
    with pytest.raises(WorkloadError, match="missing output_tokens") as info:
        load_trace(path)
    assert f"{path}:3" in str(info.value)


def test_lengths_past_the_token_bound_are_bad_lengths() -> None:
    with pytest.raises(WorkloadError, match="bad token length"):
        LengthDist.parse("1..1000000000")
    assert LengthDist.parse("exp:64").largest is None and LengthDist.parse("8..32").largest == 32
