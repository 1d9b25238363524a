"""The serving simulator's step times are op-graph simulations of the same batch shapes."""

from __future__ import annotations

import json

import pytest

from hardware import load_hardware, resolve_cost_model
from opgraph.study import run_study, study_config
from simulators.serving import LengthDist, ServingResult, StepShape, bucket, poisson_workload
from tests.conftest import TINY_LLAMA


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    from opgraph.scenario.serving import capture_serving_model

    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path), capture_serving_model(str(path))


@pytest.mark.parametrize("model", ["roofline", "default"])
@pytest.mark.parametrize(
    ("phase", "batch", "size"),
    [("decode", 5, 11), ("decode", 16, 30), ("prefill", 3, 12), ("prefill", 1, 32)],
)
def test_step_time_equals_the_simulation_of_a_fresh_capture(
    tiny: tuple[str, object], phase: str, batch: int, size: int, model: str
) -> None:
    # The default (the H100's shipped profile) prices layouts too: a prefill's KV-cache write out of a
    # transposed view costs more than a contiguous copy, so a rebatched step must keep its inputs' strides.
    from hardware import default_cost_model
    from opgraph.capture import capture
    from opgraph.scenario.serving import serving_costs

    path, templates = tiny
    hw, cfg = load_hardware("h100"), study_config()
    cm = resolve_cost_model("roofline") if model == "roofline" else default_cost_model(hw)[0]
    costs = serving_costs(templates, hw, cm, cfg)  # type: ignore[arg-type]
    if phase == "decode":
        shape = StepShape(decode_kv=(size + 1,) * batch)  # a cache of `size` tokens plus the new one
        fresh = capture(path, phase="decode", batch=batch, kv_len=size)
    else:
        shape = StepShape(prefill=((size, size),) * batch)
        fresh = capture(path, phase="prefill", batch=batch, seq_len=size)
    exact = size + 1 if phase == "decode" else size
    assert bucket(exact) == exact and bucket(batch) == batch  # sizes on the bucket grid: no rounding
    expected = run_study(fresh, hw, cm, cfg).result.makespan_us
    assert costs.step_us(shape) == pytest.approx(expected, rel=1e-12)


def test_bucketed_step_is_priced_at_the_bucket_above(tiny: tuple[str, object]) -> None:
    from opgraph.scenario.serving import serving_costs

    _, templates = tiny
    costs = serving_costs(templates, load_hardware("h100"), resolve_cost_model("roofline"), study_config())  # type: ignore[arg-type]
    # 33 keys round up to 34: same price as 34, and the memo holds one entry for both.
    assert costs.step_us(StepShape(decode_kv=(33,) * 4)) == costs.step_us(StepShape(decode_kv=(34,) * 4))
    assert len(costs.memo) == 1


def test_a_model_without_sliding_windows_keeps_its_keys(tiny: tuple[str, object]) -> None:
    from opgraph.scenario.serving import serving_costs

    _, templates = tiny
    costs = serving_costs(templates, load_hardware("h100"), resolve_cost_model("roofline"), study_config())  # type: ignore[arg-type]
    shape = StepShape(prefill=((30, 300),), decode_kv=(10, 5000, 20000))
    assert costs.windows == () and costs.key(shape) == shape.key() and not shape.key().decode_window_kv


def test_tiny_served_workload_end_to_end(tiny: tuple[str, object]) -> None:
    from opgraph.scenario.serving import simulate_serving

    _, templates = tiny
    reqs = poisson_workload(
        rate=200.0, num_requests=30, prompt_len=LengthDist.parse("4..40"), output_len=LengthDist.parse("1..20"), seed=3
    )
    for name in ("static", "continuous", "chunked"):
        res = simulate_serving(
            templates,
            reqs,
            hardware=load_hardware("h100"),
            cost_model=resolve_cost_model("roofline"),  # type: ignore[arg-type]
            config=study_config(),
            scheduler=name,
            max_batch=8,
            token_budget=64,
        )
        assert res.summary.completed == 30, name
        assert sum(r.output_tokens for r in res.requests) == sum(r.output_tokens for r in reqs)
        assert ServingResult.model_validate_json(res.model_dump_json()) == res
        # Every request's first token comes no earlier than its arrival plus one step.
        assert all(r.first_token_s > r.arrival_s for r in res.requests)


def test_tensor_parallel_steps_are_sharded_graphs_and_halve_the_kv_per_token(tiny: tuple[str, object]) -> None:
    from opgraph.ir import OpKind
    from opgraph.scenario.serving import StepGraphs, serving_costs
    from simulators.serving import StepKey

    _, templates = tiny
    hw = load_hardware("h100")
    kv1, kv2 = templates.kv_spec(hw, 1), templates.kv_spec(hw, 2)  # type: ignore[attr-defined]
    # 2 layers x 2 kv heads x 16 head_dim x (K, V) x 2 bytes, split over the ranks' heads.
    assert (kv1.bytes_per_token, kv2.bytes_per_token) == (256, 128)
    key = StepKey((), 4, 20)
    g1, g2 = StepGraphs(templates, 1).graph(key), StepGraphs(templates, 2).graph(key)  # type: ignore[arg-type]
    assert not g1.ops_of(OpKind.COLLECTIVE) and g2.ops_of(OpKind.COLLECTIVE)
    cfg = study_config(tp=2)
    costs = serving_costs(templates, hw, resolve_cost_model("roofline"), cfg)  # type: ignore[arg-type]
    expected = run_study(g2, hw, resolve_cost_model("roofline"), cfg, shard=False).result.makespan_us
    assert costs.key_us(key) == pytest.approx(expected, rel=1e-12)
