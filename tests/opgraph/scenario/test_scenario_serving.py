"""Scenarios with a ``[serving]`` section: a served workload and expectations on its percentiles."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from opgraph.scenario import ScenarioError, ServingSummary, failure_lines, parse_scenario, planned_checks, run_scenario
from simulators.serving import ServingResult
from tests.conftest import TINY_LLAMA

SCENARIO = """
[model]
source = "config.json"

[[phases]]
phase = "decode"
batch = 2
kv_len = 16

[serving]
scheduler = "continuous"
max_batch = 4
token_budget = 64

[serving.poisson]
rate = 100.0
num_requests = 12
prompt_len = "4..24"
output_len = "1..12"
seed = 1

[serving.expect]
ttft_p99_ms = {max = 1000.0}
tpot_p50_ms = {min = 0.0001}
output_tokens_per_s = {min = 1.0}
e2e_p99_ms = {max = 0.000001}
dropped = 0
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    path = tmp_path / "serve.scenario.toml"
    path.write_text(text)
    return path


def test_serving_section_runs_and_checks_percentiles(tmp_path: Path) -> None:
    path = _write(tmp_path, SCENARIO)
    summary = run_scenario(path, tmp_path / "out", reports=False)
    ids = [e.id for e in summary.expectations if e.phase == "serving"]
    assert ids == [
        "serving/ttft_p99_ms",
        "serving/tpot_p50_ms",
        "serving/e2e_p99_ms",
        "serving/output_tokens_per_s",
        "serving/dropped",
    ]
    assert ids == [i for i in planned_checks(parse_scenario(_toml(SCENARIO))) if i.startswith("serving/")]
    result = ServingResult.model_validate_json((tmp_path / "out" / "serving.result.json").read_text())
    assert isinstance(summary.serving, ServingSummary) and summary.serving == result.summary
    assert result.summary.completed == 12
    by_id = {e.id: e for e in summary.expectations}
    # The values checked are the result's own percentiles; only the impossible bound fails.
    assert by_id["serving/ttft_p99_ms"].value == pytest.approx(result.summary.ttft_ms.p99)
    assert [e.id for e in summary.failures] == ["serving/e2e_p99_ms"]
    assert not summary.passed
    assert failure_lines(summary)[0].startswith("serving e2e_p99_ms: e2e_p99_ms = ")


def _toml(text: str) -> dict[str, object]:
    import tomllib

    return tomllib.loads(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"poisson": None}, "give either requests = TRACE or a [serving.poisson] section"),
        ({"requests": "t.jsonl"}, "give either requests = TRACE or a [serving.poisson] section"),
        ({"expect": {"ttft_p99_ms": {}}}, "give min, max or both"),
        ({"expect": {"ttft_p42_ms": {"max": 1}}}, "ttft_p42_ms"),
    ],
)
def test_bad_serving_sections_are_refused(change: dict[str, object], message: str) -> None:
    data = _toml(SCENARIO)
    serving = dict(data["serving"])  # type: ignore[call-overload]
    for k, v in change.items():
        if v is None:
            serving.pop(k)
        else:
            serving[k] = v
    data["serving"] = serving
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data, "inline")


def test_a_bad_trace_names_the_serving_section(tmp_path: Path) -> None:
    text = SCENARIO.replace("[serving.poisson]", "[unused]").replace(
        'scheduler = "continuous"', 'scheduler = "continuous"\nrequests = "t.jsonl"'
    )
    text = text[: text.index("[unused]")] + text[text.index("[serving.expect]") :]
    path = _write(tmp_path, text)
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}\n')
    with pytest.raises(ScenarioError, match=r"serving.*prompt_tokens must be at least 1"):
        run_scenario(path, tmp_path / "out", reports=False)


@pytest.mark.parametrize(
    ("config", "per_token"),
    [
        # GQA: 2 layers x 2 KV heads x head size 64 / 4 heads = 16 x (K and V) x 2 bytes
        (SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64), 256),
        # MLA: one latent of kv_lora_rank + rope dims (512 + 64) per token and layer, 3 layers x 2 bytes
        (SimpleNamespace(num_hidden_layers=3, kv_lora_rank=512, qk_rope_head_dim=64), 3456),
    ],
)
def test_kv_shape_of_a_config_gives_the_cached_bytes_per_token(config: SimpleNamespace, per_token: int) -> None:
    from opgraph.scenario.serving import _kv_shape
    from simulators.serving import KvCacheSpec

    shape = _kv_shape(config, None, 2.0)
    spec = KvCacheSpec.from_model(**shape, tp=1, memory_bytes=80e9, weights_bytes=0)
    assert spec.bytes_per_token == per_token
