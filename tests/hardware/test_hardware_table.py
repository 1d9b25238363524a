"""The table model and its saved form (what calibration writes): lookup, interpolation, fallback, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware import (
    Bound,
    CostModelError,
    CostTable,
    RooflineModel,
    RooflineParams,
    TableEntry,
    TableModel,
    load_hardware,
    resolve_cost_model,
)
from opgraph.ir import Attention, DType, Gemm, LoadError, Norm, OpBase, View

H100 = load_hardware("h100")


def gemm(m: int) -> Gemm:
    return Gemm(id=0, m=m, n=4096, k=4096)


@pytest.fixture
def table() -> CostTable:
    measured: list[tuple[OpBase, float]] = [
        (gemm(128), 20e-6),
        (gemm(512), 50e-6),
        (gemm(512), 54e-6),
        (gemm(512), 52e-6),
    ]
    measured.append((Norm(id=0, rows=2048, hidden=4096), 12e-6))
    hw = H100.model_copy(update={"launch_latency_us": 3.0})
    return CostTable.from_measurements(measured, hardware=hw, source={"device": "NVIDIA H100 80GB HBM3"})


def test_from_measurements_keeps_the_median(table: CostTable) -> None:
    by_m = {e.shape["m"]: e for e in table.entries if e.kind.value == "gemm"}
    assert by_m[512].seconds == pytest.approx(52e-6) and by_m[512].samples == 3
    assert by_m[128].definition == "gemm_n4096_k4096" and by_m[128].dtype is DType.bf16


def test_exact_interpolated_extrapolated_and_fallback(table: CostTable) -> None:
    model = TableModel(table)
    assert model.estimate(gemm(128), H100).seconds == pytest.approx(20e-6)
    assert "measured" in model.estimate(gemm(128), H100).detail
    mid = model.estimate(gemm(320), H100)
    assert 20e-6 < mid.seconds < 52e-6 and "interpolated" in mid.detail
    assert model.estimate(gemm(320), H100).seconds == pytest.approx(
        20e-6 + (52e-6 - 20e-6) * (gemm(320).flops - gemm(128).flops) / (gemm(512).flops - gemm(128).flops)
    )
    # Outside the measured range: the fallback scaled by the efficiency at the nearest measured shape.
    roof = RooflineModel(table.roofline)
    above, below = model.estimate(gemm(1024), H100), model.estimate(gemm(16), H100)
    ratio_512 = 52e-6 / roof.estimate(gemm(512), H100).seconds
    assert above.seconds == pytest.approx(roof.estimate(gemm(1024), H100).seconds * ratio_512)
    assert below.seconds == pytest.approx(
        roof.estimate(gemm(16), H100).seconds * 20e-6 / roof.estimate(gemm(128), H100).seconds
    )
    assert "extrapolated" in above.detail and "m=512" in above.detail and "m=128" in below.detail
    other = Gemm(id=0, m=128, n=1024, k=4096)
    fallback = model.estimate(other, H100)
    assert "fallback" in fallback.detail
    assert fallback.seconds == pytest.approx(RooflineModel(table.roofline).estimate(other, H100).seconds)
    assert model.estimate(View(id=0), H100).bound is Bound.FREE


def test_bound_comes_from_the_fallback(table: CostTable) -> None:
    model = TableModel(table)
    assert model.estimate(Norm(id=0, rows=2048, hidden=4096), H100).bound is Bound.MEMORY


def test_fitted_fallback_parameters_are_used() -> None:
    params = RooflineParams(attention_efficiency=0.25)
    table = CostTable(roofline=params)
    op = Attention(id=0, batch=1, q_len=4096, kv_len=4096, heads=32, kv_heads=8, head_dim=128)
    slow = TableModel(table).estimate(op, H100).seconds
    assert slow == pytest.approx(RooflineModel(params).estimate(op, H100).seconds)
    assert slow > RooflineModel().estimate(op, H100).seconds


def test_save_load_round_trip_and_resolve_by_path(table: CostTable, tmp_path: Path) -> None:
    path = table.save(tmp_path / "calib.json")
    assert CostTable.load(path) == table
    assert CostTable.model_validate_json(table.model_dump_json()) == table
    model = resolve_cost_model(str(path))
    assert isinstance(model, TableModel) and model.estimate(gemm(128), H100).seconds == pytest.approx(20e-6)
    assert isinstance(resolve_cost_model("table", path=str(path)), TableModel)
    gz = table.save(tmp_path / "calib.json.gz")
    assert isinstance(resolve_cost_model(str(gz)), TableModel)


def test_table_measured_on_another_device_is_refused(table: CostTable, tmp_path: Path) -> None:
    path = table.save(tmp_path / "calib.json")
    model = resolve_cost_model(str(path))
    with pytest.raises(CostModelError, match="measured on 'h100-sxm', not 'b200'") as err:
        model.estimate(gemm(128), load_hardware("b200"))
    assert str(path) in str(err.value)
    lax = resolve_cost_model(str(path), check_hardware="false")
    assert lax.estimate(gemm(128), load_hardware("b200")).seconds == pytest.approx(20e-6)


def test_bad_table_files(tmp_path: Path) -> None:
    entry = TableEntry.from_op(gemm(8), 1e-6).model_dump(mode="json")
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps({"schema_version": 1, "entries": [entry, entry]}))
    with pytest.raises(LoadError, match="appears twice") as err:
        resolve_cost_model(str(dup))
    assert str(dup) in str(err.value)
    negative = tmp_path / "neg.json"
    negative.write_text(json.dumps({"schema_version": 1, "entries": [{**entry, "seconds": -1}]}))
    with pytest.raises(LoadError, match=r"entries\.0\.seconds"):
        resolve_cost_model(str(negative))
    with pytest.raises(LoadError, match="no such file"):
        resolve_cost_model(str(tmp_path / "absent.json"))
    with pytest.raises(CostModelError, match="needs a cost table"):
        resolve_cost_model("table")
