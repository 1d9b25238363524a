"""Finding cost models (names, module:Class, file.py:Class, entry points) and the errors of bad ones."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from hardware import (
    COST_MODELS,
    Bound,
    Cost,
    CostModelError,
    FormulaModel,
    HardwareSpec,
    RooflineModel,
    cost_graph,
    load_hardware,
    parse_cost_options,
    resolve_cost_model,
)
from opgraph.ir import Gemm, OpBase, OpGraph, RegistryError

H100 = load_hardware("h100")
GRAPH = OpGraph(ops=(Gemm(id=0, m=8, n=8, k=8), Gemm(id=7, m=16, n=8, k=8)))


class Flat:
    """A test model: every op 1 us."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        return Cost(1e-6, Bound.COMPUTE)


class Raises:
    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        raise ZeroDivisionError("boom")


class Negative:
    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        return Cost(-1e-6, Bound.COMPUTE)


class NotACost:
    def estimate(self, op: OpBase, hw: HardwareSpec) -> float:
        return 1e-6


def test_builtin_names() -> None:
    assert {"roofline", "formula", "table", "collective"} <= set(COST_MODELS.names())
    assert isinstance(resolve_cost_model("roofline"), RooflineModel)
    assert isinstance(resolve_cost_model(" formula "), FormulaModel)


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(RegistryError, match="unknown cost model 'rooflin'") as err:
        resolve_cost_model("rooflin")
    assert "roofline" in str(err.value) and "formula" in str(err.value)


def test_module_class_and_options() -> None:
    model = resolve_cost_model("hardware.models.roofline:RooflineModel", vector_efficiency=0.3)
    assert isinstance(model, RooflineModel) and model.params.vector_efficiency == 0.3
    assert isinstance(resolve_cost_model(f"{__name__}:Flat"), Flat)
    with pytest.raises(RegistryError, match="cannot import module"):
        resolve_cost_model("no_such_module_xyz:Model")
    with pytest.raises(CostModelError, match="cannot build"):
        resolve_cost_model(f"{__name__}:Flat", speed=2)


def test_user_python_file(tmp_path: Path) -> None:
    path = tmp_path / "my_models.py"
    path.write_text(
        "from hardware import Bound, Cost\n"
        "class Half:\n"
        "    def __init__(self, us=2.0):\n"
        "        self.us = float(us)\n"
        "    def estimate(self, op, hw):\n"
        "        return Cost(self.us * 1e-6, Bound.COMPUTE)\n"
        "not_a_model = 3\n"
    )
    model = resolve_cost_model(f"{path}:Half", us="4")
    assert model.estimate(GRAPH.ops[0], H100).us == pytest.approx(4)
    with pytest.raises(CostModelError, match="has no attribute 'Nope'") as err:
        resolve_cost_model(f"{path}:Nope")
    assert str(path) in str(err.value)
    with pytest.raises(CostModelError, match="no estimate"):
        resolve_cost_model(f"{path}:not_a_model")
    with pytest.raises(CostModelError, match="no such Python file"):
        resolve_cost_model(f"{tmp_path / 'absent.py'}:Half")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('bad import')\n")
    with pytest.raises(CostModelError, match="importing it raised RuntimeError: bad import") as err:
        resolve_cost_model(f"{broken}:X")
    assert str(broken) in str(err.value)


def test_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint(name="fancy", value="hardware.models.formula:FormulaModel", group="opgraph.cost_models")

    def fake_entry_points(group: str) -> list[EntryPoint]:
        return [ep] if group == "opgraph.cost_models" else []

    monkeypatch.setattr("opgraph.ir.registry.entry_points", fake_entry_points)
    assert isinstance(resolve_cost_model("fancy"), FormulaModel)


def test_an_instance_is_used_as_is_and_takes_no_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "FLAT", Flat(), raising=False)
    assert resolve_cost_model(f"{__name__}:FLAT") is module.FLAT  # type: ignore[attr-defined]
    with pytest.raises(CostModelError, match="takes no options"):
        resolve_cost_model(f"{__name__}:FLAT", x=1)


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        (Raises(), "raised ZeroDivisionError: boom"),
        (Negative(), "invalid time -1e-06"),
        (NotACost(), "returned float, not a Cost"),
    ],
)
def test_bad_model_output_names_the_op(model: object, fragment: str) -> None:
    with pytest.raises(CostModelError) as err:
        cost_graph(GRAPH, model, H100)  # type: ignore[arg-type]
    text = str(err.value)
    assert text.startswith("op 0 (gemm_n8_k8)") and fragment in text, text


def test_parse_cost_options() -> None:
    assert parse_cost_options(["a=0.5", "b=true", "c=ring", 'd={"gemm": 2}']) == {
        "a": 0.5,
        "b": True,
        "c": "ring",
        "d": {"gemm": 2},
    }
    with pytest.raises(CostModelError, match="not KEY=VALUE"):
        parse_cost_options(["oops"])
    model = resolve_cost_model("roofline", **parse_cost_options(['time_scale={"gemm": 2}']))
    assert isinstance(model, RooflineModel) and model.params.time_scale
