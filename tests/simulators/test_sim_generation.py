"""Simulating a planned generation from a few step windows gives the full simulation's makespan."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from hardware import load_hardware, resolve_cost_model
from opgraph.capture import capture
from opgraph.ir import OpGraph
from opgraph.study import study_config
from simulators import SimulationError, simulate, simulate_generation
from tests.conftest import TINY_LLAMA


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> OpGraph:
    path = tmp_path_factory.mktemp("gen") / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 256}))
    graph = capture(str(path), phase="generate", seq_len=96, new_tokens=14)
    assert graph.generation is not None
    return graph


@pytest.mark.parametrize("host_mode", ["none", "eager"])
@pytest.mark.parametrize("max_windows", [3, 20])
def test_window_simulation_matches_the_full_one(planned: OpGraph, host_mode: str, max_windows: int) -> None:
    # 20 windows: every planned step simulated; 3: most steps interpolated between windows.
    hw, cm, cfg = load_hardware("h100"), resolve_cost_model("roofline"), study_config(host_mode=host_mode)
    full = simulate(planned.expand(), hw, cm, cfg)
    fast = simulate_generation(planned, hw, cm, cfg, max_windows=max_windows)
    assert fast.makespan_us == pytest.approx(full.makespan_us, rel=1e-3)
    plan = planned.generation
    assert plan is not None
    simulated = len(fast.windows)
    assert simulated == (len(plan.steps) if max_windows == 20 else 4)


def test_timeline_expands_every_step(planned: OpGraph) -> None:
    hw, cm, cfg = load_hardware("h100"), resolve_cost_model("roofline"), study_config(host_mode="eager")
    full = simulate(planned.expand(), hw, cm, cfg).timeline()
    fast = simulate_generation(planned, hw, cm, cfg, max_windows=3)
    spans = list(fast.iter_spans())
    assert len(spans) == len(full.spans)
    assert sorted(s.op_id for s in spans if s.op_id is not None) == sorted(
        s.op_id for s in full.spans if s.op_id is not None
    )
    assert max(s.end_us for s in spans) == pytest.approx(full.end_us, rel=1e-3)


def test_a_graph_without_a_plan_is_refused() -> None:
    with pytest.raises(SimulationError, match="no generation plan"):
        simulate_generation(OpGraph(), load_hardware("h100"), resolve_cost_model("roofline"))
