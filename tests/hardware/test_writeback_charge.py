"""The profile model's write-back charge: what an op pays for the dirty L2 lines the op before it left."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from hardware import Cost, ProfileModel, cost_graph, load_hardware
from hardware.base import Bound, WritebackModel
from hardware.models.profile import (
    WRITEBACK_MAX_BYTES,
    WRITEBACK_TAG,
    ProfileWritebackWarning,
    WritebackCurve,
    evicted_dirty_bytes,
    writeback_curves,
)
from hardware.profile import DeviceProfile, ProfilePoint
from opgraph.cli.app import app
from opgraph.ir import DType, Elementwise, Gemm, OpBase, OpGraph, TensorSpec, save_graph
from tests.hardware.profile_builders import synthetic_profile
from validators.configs import config_key
from validators.profile import WRITEBACK_MIB, sweep_points, writeback_ops

MIB = 2**20
L2 = 50 * MIB


def _tensor(mib: float, tid: int) -> TensorSpec:
    return TensorSpec(shape=(int(mib * MIB) // 2,), dtype=DType.bf16, id=tid)


def _add(mib: float, ins: tuple[int, int], out: int, op_id: int = 0) -> Elementwise:
    """An add of two ``mib`` MiB bf16 tensors (ids ``ins``) into one (id ``out``)."""
    return Elementwise(
        id=op_id, fn="add", numel=int(mib * MIB) // 2,
        inputs=(_tensor(mib, ins[0]), _tensor(mib, ins[1])), outputs=(_tensor(mib, out),),
    )  # fmt: skip


def _writeback_points(op: OpBase, penalties_us: dict[int, float], clean_us: float) -> list[ProfilePoint]:
    """``op``'s ``writeback`` points: ``clean_us`` plus each dirty MiB's penalty."""
    out = []
    for mib in (0, *penalties_us):
        key = f"{config_key(op)}-{WRITEBACK_TAG}{mib if mib else ''}"
        seconds = (clean_us + penalties_us.get(mib, 0.0)) * 1e-6
        out.append(ProfilePoint(key=key, op=op, tag=WRITEBACK_TAG, seconds=seconds, dirty_bytes=min(mib * MIB, L2)))
    return out


ADD_CURVE = {8: 2.0, 32: 8.0, 64: 8.0}
"""A memory-bound op's penalty (us) after 8, 32 and 64 MiB dirty (the last capped at the L2's 50)."""


def _profile(hw_name: str = "h100", *, with_points: bool = True) -> tuple[DeviceProfile, ProfileModel]:
    hw = load_hardware(hw_name)
    points = _writeback_points(_add(32, (1, 2), 3), ADD_CURVE, 30.0) if with_points else []
    gemm = Gemm(id=0, m=2048, n=4096, k=4096)
    points += _writeback_points(gemm, {8: 2.0, 32: 3.0}, 85.0) if with_points else []
    profile = synthetic_profile(hw, [*synthetic_profile(hw).points, *points])
    return profile, ProfileModel(profile)


def _memory_cost() -> Cost:
    return Cost(seconds=30e-6, bound=Bound.MEMORY, memory_s=25e-6, compute_s=1e-6)


def test_a_curve_interpolates_between_its_points_and_holds_past_the_last() -> None:
    curve = WritebackCurve("add", (0.0, 8 * MIB, 32 * MIB), (0.0, 2e-6, 8e-6))
    assert curve.at(0) == 0.0
    assert math.isclose(curve.at(4 * MIB), 1e-6)
    assert math.isclose(curve.at(20 * MIB), 5e-6)
    assert curve.at(200 * MIB) == 8e-6


@given(st.floats(0, 1e9), st.floats(0, 1e9))
def test_a_curve_is_monotone_where_its_points_are(a: float, b: float) -> None:
    curve = WritebackCurve("add", (0.0, 8 * MIB, 32 * MIB, 50 * MIB), (0.0, 2e-6, 8e-6, 8e-6))
    lo, hi = sorted((a, b))
    assert 0.0 <= curve.at(lo) <= curve.at(hi) <= 8e-6


def test_curves_pair_each_op_with_its_clean_point_by_kind_and_bound() -> None:
    profile, _ = _profile()
    curves = writeback_curves(profile, load_hardware("h100"))
    assert set(curves) == {("elementwise", True), ("gemm", False)}
    (add,) = curves[("elementwise", True)]
    assert add.dirty == (0.0, 8 * MIB, 32 * MIB, L2)
    assert [round(p * 1e6, 6) for p in add.penalty_s] == [0.0, 2.0, 8.0, 8.0]


def test_a_curve_without_its_clean_point_is_left_out() -> None:
    hw = load_hardware("h100")
    points = [p for p in _writeback_points(_add(32, (1, 2), 3), ADD_CURVE, 30.0) if p.dirty_bytes]
    assert writeback_curves(synthetic_profile(hw, [*synthetic_profile(hw).points, *points]), hw) == {}


def test_the_dirty_lines_leave_the_l2_only_past_what_else_it_holds() -> None:
    writer = _add(16, (1, 2), 3)
    assert evicted_dirty_bytes(_add(8, (4, 5), 6), writer, L2) == 0.0  # 24 MiB moved: the 16 dirty stay
    assert evicted_dirty_bytes(_add(32, (4, 5), 6), writer, L2) == 16 * MIB  # 96 MiB moved: all leave
    # 48 MiB moved, none of it the writer's: 14 MiB of the dirty lines leave; reading them, none do.
    assert evicted_dirty_bytes(_add(16, (4, 5), 6), writer, L2) == 14 * MIB
    assert evicted_dirty_bytes(_add(16, (3, 5), 6), writer, L2) == 0.0
    assert evicted_dirty_bytes(_add(16, (4, 5), 6), writer, 0.0) == 16 * MIB  # no L2 size: what could meet


def test_a_gemm_leaves_its_output_clean() -> None:
    out = _tensor(64, 3)
    gemm = Gemm(id=0, m=8192, n=4096, k=4096, outputs=(out,))
    assert gemm.bytes_written > 32 * MIB
    assert evicted_dirty_bytes(_add(64, (4, 5), 6), gemm, L2) == 0.0


def test_memory_bound_ops_pay_the_curve_at_the_bytes_they_evict() -> None:
    _, model = _profile()
    hw = load_hardware("h100")
    assert isinstance(model, WritebackModel)
    writer, reader = _add(32, (1, 2), 3), _add(64, (4, 5), 6)
    cost = model.after_write(reader, _memory_cost(), writer, hw)
    assert math.isclose(cost.seconds, 30e-6 + 8e-6)
    assert "+8 us write-back of 32 MiB the op before left dirty in L2 (the elementwise writeback points)" in cost.detail
    # 16 MiB dirty, all evicted: a third of the way from the 8 MiB point (2 us) to the 32 MiB one (8 us).
    half = model.after_write(reader, _memory_cost(), _add(16, (1, 2), 3), hw)
    assert math.isclose(half.seconds, 30e-6 + 4e-6)


def test_compute_bound_ops_small_writes_and_the_option_off_pay_nothing() -> None:
    _, model = _profile()
    hw = load_hardware("h100")
    writer, reader = _add(32, (1, 2), 3), _add(64, (4, 5), 6)
    compute = Cost(seconds=90e-6, bound=Bound.COMPUTE, memory_s=10e-6, compute_s=70e-6)
    gemm = Gemm(id=1, m=2048, n=4096, k=4096)
    assert model.after_write(gemm, compute, writer, hw) is compute
    small = _memory_cost()
    assert model.after_write(reader, small, _add(0.5, (1, 2), 3), hw).seconds < small.seconds + 0.2e-6
    off = ProfileModel(_profile()[0], writeback="false")
    assert off.after_write(reader, small, writer, hw) is small


def test_a_kind_without_points_takes_the_other_memory_bound_kinds_and_no_points_charge_nothing() -> None:
    _, model = _profile()
    hw = load_hardware("h100")
    copy_out = _tensor(64, 7)
    from opgraph.ir import Memory

    copy = Memory(id=1, fn="copy", numel=copy_out.numel, inputs=(_tensor(64, 4),), outputs=(copy_out,))
    cost = model.after_write(copy, _memory_cost(), _add(32, (1, 2), 3), hw)
    assert "(the other kinds' writeback points)" in cost.detail and math.isclose(cost.seconds, 38e-6)
    _, bare = _profile(with_points=False)
    with pytest.warns(ProfileWritebackWarning, match="has no writeback points: no op is charged"):
        assert bare.after_write(copy, _memory_cost(), _add(32, (1, 2), 3), hw).seconds == 30e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        assert bare.after_write(copy, _memory_cost(), _add(32, (1, 2), 3), hw).seconds == 30e-6


def test_cost_graph_charges_each_op_for_the_op_before_it_in_graph_order() -> None:
    hw = load_hardware("h100")
    writer, reader = _add(32, (1, 2), 3, op_id=0), _add(64, (4, 5), 6, op_id=1)
    on, off = ProfileModel(), ProfileModel(writeback=False)
    forward = OpGraph(ops=(writer, reader))
    charged, plain = cost_graph(forward, on, hw), cost_graph(forward, off, hw)
    assert charged.costs[0].seconds == plain.costs[0].seconds  # the first op follows nothing
    extra = charged.costs[1].seconds - plain.costs[1].seconds
    assert 5e-6 < extra < 12e-6 and "write-back of 32 MiB" in charged.costs[1].detail
    # Reversed, the big add writes 64 MiB (all the L2 dirty) before the small one, which moves 96 MiB.
    back = cost_graph(OpGraph(ops=(reader.model_copy(update={"id": 0}), writer.model_copy(update={"id": 1}))), on, hw)
    assert back.costs[0].seconds == plain.costs[1].seconds
    assert back.costs[1].seconds > plain.costs[0].seconds


def test_the_sweep_measures_each_kind_at_every_dirty_amount() -> None:
    assert max(WRITEBACK_MIB) * MIB == WRITEBACK_MAX_BYTES and WRITEBACK_MIB[0] == 0
    points = [p for p in sweep_points("cuda") if p.tag == WRITEBACK_TAG]
    names = {name for name, _ in writeback_ops()}
    assert len(points) == len(names) * len(WRITEBACK_MIB)
    assert {p.dirty_bytes for p in points} == {mib * MIB for mib in WRITEBACK_MIB}
    assert len({p.key for p in points}) == len(points)
    hw = load_hardware("h100")
    for _, op in writeback_ops():  # each moves more than the most left dirty: it meets all of it
        assert op.bytes_read + op.bytes_written >= WRITEBACK_MAX_BYTES
    kinds = {(op.kind, op.flops >= hw.ridge_point(op.dtype) * op.total_bytes) for _, op in writeback_ops()}
    assert len(kinds) >= 6
    assert not [p for p in sweep_points("cpu") if p.tag == WRITEBACK_TAG]  # no L2 flush on a CPU
    plan = CliRunner().invoke(app, ["profile", "--device", "cuda", "--plan"])
    assert plan.exit_code == 0, plan.output
    listed = [line for line in plan.output.splitlines() if "[writeback" in line]
    assert len(listed) == len(points) and sum("[writeback, 64 MiB dirty]" in line for line in listed) == len(names)


@pytest.mark.parametrize("device", ["h100-sxm", "h200"])
def test_the_shipped_profiles_hold_every_write_back_point(device: str) -> None:
    from hardware import load_profile

    root = Path(__file__).resolve().parents[2]
    profile = load_profile(root / "hardware" / "catalog" / f"{device}.profile.json")
    curves = writeback_curves(profile, load_hardware(device))
    assert sum(len(c) for c in curves.values()) == len(writeback_ops())
    memory = [c for (_, bound), cs in curves.items() if bound for c in cs]
    assert len(memory) >= 6
    # Measured: every memory-bound kind pays 1-10 us for the L2's worth of dirty lines on these GPUs, after
    # the dirty bytes the sweep asked for (the last capped at the GPU's L2, 50 MiB on the H100, 60 on the H200).
    assert all(1e-6 < c.penalty_s[-1] < 12e-6 for c in memory)
    for c in (c for cs in curves.values() for c in cs):
        assert c.dirty[:-1] == tuple(float(mib * MIB) for mib in WRITEBACK_MIB[:-1])
        assert 48 * MIB <= c.dirty[-1] <= WRITEBACK_MAX_BYTES


def test_simulate_takes_cost_options_and_the_charge_moves_the_makespan(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    save_graph(OpGraph(ops=(_add(32, (1, 2), 3, op_id=0), _add(64, (4, 5), 6, op_id=1))), path)

    def makespan(*extra: str) -> float:
        r = CliRunner().invoke(app, ["simulate", str(path), "-H", "h100", "-e", "1", "--json", *extra])
        assert r.exit_code == 0, r.output
        return float(json.loads(r.output)["makespan_us"])

    assert 5 < makespan() - makespan("--cost-option", "writeback=false") < 12
    bad = CliRunner().invoke(app, ["simulate", str(path), "-H", "h100", "--cost-option", "nope"])
    assert bad.exit_code == 2 and "not KEY=VALUE" in bad.output and "Traceback" not in bad.output
    unknown = CliRunner().invoke(app, ["simulate", str(path), "-H", "h100", "--cost-option", "color=red"])
    assert unknown.exit_code == 2 and "color" in unknown.output
