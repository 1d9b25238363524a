"""``examples/custom_cost_model.py``: its model loads by path as the CLI gives it (tests/examples runs the script)."""

from __future__ import annotations

from pathlib import Path

from hardware import Bound, load_hardware, resolve_cost_model
from opgraph.ir import Gemm, Norm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_cost_model.py"


def test_example_model_by_path_as_the_cli_gives_it() -> None:
    model = resolve_cost_model("examples/custom_cost_model.py:MyModel", gemm_efficiency=0.5)
    hw = load_hardware("h100")
    gemm = Gemm(id=0, m=4096, n=4096, k=4096)
    cost = model.estimate(gemm, hw)
    assert cost.bound is Bound.COMPUTE
    assert cost.compute_s == gemm.flops / (hw.peak_flops(gemm.dtype) * 0.5)
    norm = Norm(id=1, rows=4096, hidden=4096)
    assert model.estimate(norm, hw) == resolve_cost_model("roofline").estimate(norm, hw)
