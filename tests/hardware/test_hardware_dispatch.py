"""One registry of per-kind cost formulas: a user's own op kind costed by the built-in models, duplicates
refused, per-instance and per-subclass overrides; and no import cycle inside ``hardware``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from hardware import (
    COST_FORMULAS,
    Bound,
    Cost,
    CostTable,
    FormulaModel,
    HardwareSpec,
    RooflineModel,
    TableModel,
    cost_graph,
    load_hardware,
    register_cost,
    resolve_cost_model,
)
from opgraph.ir import Edge, Gemm, OpGraph, OpKind, Other, RegistryError
from tests.conftest import REPO

H100 = load_hardware("h100")


class TopKSampler(Other):
    """A user's own op kind: a fused top-k sampling kernel the IR does not know."""

    fn: str = "topk_sample"
    rows: int = 1
    vocab: int = 32000


def sampler_cost(model: RooflineModel, op: TopKSampler, hw: HardwareSpec) -> Cost:
    """One pass over the logits at the roofline's bandwidth curve, plus the launch."""
    nbytes = op.rows * op.vocab * op.dtype.itemsize
    memory, eff = model.memory_s(OpKind.REDUCTION, nbytes, hw)
    return model.finish(op, hw, 0.0, memory, None, eff, detail=f"top-k sampler over {op.vocab} logits")


def sampler_elements(model: FormulaModel, op: TopKSampler, hw: HardwareSpec) -> Cost:
    return model.from_elements(op, hw, float(op.rows * op.vocab))


@pytest.fixture
def registered() -> Iterator[None]:
    register_cost("roofline", TopKSampler)(sampler_cost)
    register_cost(FormulaModel, TopKSampler)(sampler_elements)
    yield
    COST_FORMULAS.unregister("roofline", TopKSampler)
    COST_FORMULAS.unregister("formula", TopKSampler)


def graph() -> OpGraph:
    ops = (Gemm(id=0, m=8, n=32000, k=4096), TopKSampler(id=1, rows=8, vocab=32000))
    return OpGraph(ops=ops, edges=(Edge(src=0, dst=1),))


def test_a_users_op_kind_is_costed_by_the_builtin_models_through_the_public_api(registered: None) -> None:
    g = graph()
    costs = cost_graph(g, resolve_cost_model("roofline"), H100)
    assert not costs.uncosted
    sampler = costs.costs[1]
    assert "top-k sampler over 32000 logits" in sampler.detail and sampler.bound is Bound.LAUNCH
    # A calibrated table that never saw the op falls back to the roofline, which finds the formula.
    table = TableModel(CostTable(hardware=H100))
    assert "top-k sampler" in table.estimate(g.ops[1], H100).detail
    with pytest.warns(UserWarning, match="ignores h100-sxm"):
        formula = cost_graph(g, FormulaModel(), H100)
    assert formula.costs[1].us == pytest.approx(8 * 32000 * 0.5 * 0.1)


def test_the_users_op_kind_is_simulated(registered: None) -> None:
    from simulators import SimulationConfig, simulate

    result = simulate(graph(), H100, resolve_cost_model("roofline"), SimulationConfig.standard(1))
    names = {span.name for span in result.timeline().spans}
    assert any("topk_sample" in name for name in names), names


def test_without_a_registration_the_op_is_only_a_generic_other() -> None:
    cost = RooflineModel().estimate(TopKSampler(id=0, rows=8, bytes_read=8, bytes_written=8), H100)
    assert "unrecognised op 'topk_sample'" in cost.detail


def test_duplicates_raise_and_unknown_keys_are_refused(registered: None) -> None:
    with pytest.raises(RegistryError, match="already has a formula for 'TopKSampler'"):
        register_cost("roofline", TopKSampler)(sampler_cost)
    with pytest.raises(RegistryError, match="already has a formula for 'gemm'"):
        register_cost("roofline", OpKind.GEMM)(sampler_cost)
    with pytest.raises(RegistryError, match="already has a formula for 'gemm'"):
        register_cost("roofline", "gemm")(sampler_cost)
    with pytest.raises(RegistryError, match="op kind or an op class"):
        register_cost("roofline", 3)(sampler_cost)  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="no formula"):
        COST_FORMULAS.unregister("roofline", "no_such_kind")
    assert {"TopKSampler", "gemm", "attention", "view"} <= set(COST_FORMULAS.keys("roofline"))


def test_per_instance_formulas_and_subclassed_models() -> None:
    gemm = Gemm(id=0, m=8, n=8, k=8)

    def flat(model: RooflineModel, op: Gemm, hw: HardwareSpec) -> Cost:
        return Cost(1e-3, Bound.COMPUTE, detail="flat")

    assert RooflineModel(formulas={"gemm": flat}).estimate(gemm, H100).detail == "flat"
    assert RooflineModel().estimate(gemm, H100).detail != "flat"

    class MyRoofline(RooflineModel):
        name = "my-roofline"

    assert MyRoofline().estimate(gemm, H100) == RooflineModel().estimate(gemm, H100)
    register_cost(MyRoofline, OpKind.GEMM)(flat)
    try:
        assert MyRoofline().estimate(gemm, H100).detail == "flat"
        assert RooflineModel().estimate(gemm, H100).detail != "flat"
    finally:
        COST_FORMULAS.unregister("my-roofline", OpKind.GEMM)


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package`` that ``path`` imports anywhere (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == package or m.startswith(package + ".")}


def test_no_import_cycle_inside_the_hardware_package() -> None:
    root = REPO / "hardware"
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = _imports(path, "hardware")
    edges = {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}
    # Package facades import their submodules; a submodule importing its own facade would be a cycle too.
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(d) :], d]))
            if d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])
