"""Collective benchmark: sizes, cases from a sharded graph, kernel attribution, and a gloo run on two ranks."""

from __future__ import annotations

import doctest
import itertools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import validators.collectives as vc
from opgraph.ir import Collective, CollectiveKind, DType, Gemm, OpGraph, TensorSpec
from opgraph.transforms import shard_tensor_parallel
from validators.collectives import (
    BENCHMARKED,
    CALL_RANGE,
    CollectiveBenchError,
    CollectiveMeasurement,
    CollectiveTimer,
    graph_cases,
    kernels_per_call,
    load_measurements,
    parse_size,
    parse_sizes,
    power_of_two_groups,
    sweep_cases,
)

REPO = Path(__file__).resolve().parents[2]


def test_doctests() -> None:
    assert doctest.testmod(vc).failed == 0


def test_sizes_geometric_span_and_alignment() -> None:
    sizes = parse_sizes("4K..1G", 15)
    assert len(sizes) == 15
    assert sizes[0] == 4096 and sizes[-1] == 1 << 30
    assert all(s % 4096 == 0 for s in sizes)
    ratios = [b / a for a, b in itertools.pairwise(sizes)]
    # 2^18 over 14 steps: each about 2.44x (rounding to 4 KiB moves only the small ones much).
    assert all(2.0 < r < 3.0 for r in ratios[3:])
    assert parse_sizes("4K..1G") == tuple(1 << e for e in range(12, 31))


@pytest.mark.parametrize("text", ["", "4X", "-1", "1G..4K", "0"])
def test_bad_sizes_are_typed_errors(text: str) -> None:
    with pytest.raises(CollectiveBenchError, match="--sizes"):
        parse_sizes(text)


def test_size_units_are_binary() -> None:
    assert parse_size("16M") == 16 * 1024 * 1024
    assert parse_size("1.5K") == 1536


def test_group_sizes_are_powers_of_two() -> None:
    assert power_of_two_groups(4) == (2, 4)
    assert power_of_two_groups(7) == (2, 4)


def test_sweep_covers_every_combination() -> None:
    cases = sweep_cases(BENCHMARKED, [4096, 8192], [2, 4])
    assert len(cases) == len(BENCHMARKED) * 2 * 2
    assert len({c.key for c in cases}) == len(cases)


def _mlp_graph(tokens: int, hidden: int, inter: int, layers: int) -> OpGraph:
    ops = []
    tid = 0
    oid = 0
    for layer in range(layers):
        x = TensorSpec(shape=(tokens, hidden), dtype=DType.bf16, id=tid)
        wu = TensorSpec(shape=(hidden, inter), dtype=DType.bf16, id=tid + 1)
        h = TensorSpec(shape=(tokens, inter), dtype=DType.bf16, id=tid + 2)
        wd = TensorSpec(shape=(inter, hidden), dtype=DType.bf16, id=tid + 3)
        y = TensorSpec(shape=(tokens, hidden), dtype=DType.bf16, id=tid + 4)
        scope = f"model.layers.{layer}.mlp"
        ops.append(Gemm(id=oid, m=tokens, n=inter, k=hidden, inputs=(x, wu), outputs=(h,), scope=f"{scope}.up_proj"))
        ops.append(
            Gemm(id=oid + 1, m=tokens, n=hidden, k=inter, inputs=(h, wd), outputs=(y,), scope=f"{scope}.down_proj")
        )
        tid += 5
        oid += 2
    return OpGraph(ops=tuple(ops))


def test_graph_cases_of_a_sharded_graph() -> None:
    tokens, hidden = 8, 512
    sharded = shard_tensor_parallel(_mlp_graph(tokens, hidden, 1024, layers=3), 4)
    cases, skipped = graph_cases(sharded)
    assert skipped == []
    # One all-reduce of the down projection's whole output per layer: tokens x hidden bf16 per rank.
    assert [(c.collective, c.bytes, c.group_size, c.uses) for c in cases] == [
        (CollectiveKind.ALL_REDUCE, tokens * hidden * 2, 4, 3)
    ]
    assert cases[0].definition == next(o for o in sharded.ops if isinstance(o, Collective)).definition


def test_graph_cases_skip_what_cannot_run() -> None:
    ops = (
        Collective(id=0, collective=CollectiveKind.SEND_RECV, bytes=64, group_size=2),
        Collective(id=1, collective=CollectiveKind.ALL_REDUCE, bytes=64, group_size=1),
    )
    cases, skipped = graph_cases(OpGraph(ops=ops))
    assert cases == [] and len(skipped) == 2 and "op 0" in skipped[0]


# ---------------------------------------------------------------- kernel attribution (profiler events)
@dataclass
class _Range:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class _Dev:
    name: str


@dataclass
class _Kernel:
    name: str
    duration: float


@dataclass
class _Event:
    name: str
    device_type: _Dev
    time_range: _Range
    kernels: list[_Kernel] = field(default_factory=list)
    cpu_children: list[_Event] = field(default_factory=list)


def _cpu(name: str, kernels: list[_Kernel] | None = None, children: list[_Event] | None = None) -> _Event:
    return _Event(name, _Dev("CPU"), _Range(0, 1), kernels or [], children or [])


def test_kernels_of_each_call_come_from_its_range() -> None:
    calls = [
        _cpu(CALL_RANGE, children=[_cpu("nccl:all_reduce", [_Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", d)])])
        for d in (10.0, 12.0, 11.0)
    ]
    # A non-NCCL kernel in a range (a copy) is not the collective's time.
    calls[0].cpu_children[0].kernels.append(_Kernel("Memcpy DtoD", 50.0))
    xs, how = kernels_per_call(calls, 3)
    assert (xs, how) == ([10.0, 12.0, 11.0], "range")


def test_kernels_fall_back_to_launch_order() -> None:
    ranges = [_cpu(CALL_RANGE) for _ in range(2)]
    dev = [
        _Event("ncclDevKernel_SendRecv", _Dev("CUDA"), _Range(s, s + d))
        for s, d in ((300, 5), (0, 7), (100, 3), (200, 4))
    ]
    xs, how = kernels_per_call([*ranges, *dev], 2)
    assert how == "order" and xs == [10.0, 9.0]  # by start time: 7+3, then 4+5
    xs, how = kernels_per_call([*ranges, *dev[:3]], 2)
    assert how == "order-mean" and xs == [7.5]


# ---------------------------------------------------------------- a real run: two ranks, gloo
def _record(**kw: object) -> CollectiveMeasurement:
    base: dict[str, object] = {
        "collective": "all_reduce", "bytes": 4096, "group_size": 2, "dtype": "fp32", "median_us": 1.0,
        "iqr_us": 0.0, "samples": 1, "timer": "wall", "world_size": 2, "backend": "gloo", "device_name": "seed",
        "torch_version": "0", "created": "2026-01-01T00:00:00+00:00",
    }  # fmt: skip
    return CollectiveMeasurement.model_validate({**base, **kw})


def test_torchrun_two_ranks_gloo_with_resume(tmp_path: Path) -> None:
    out = tmp_path / "coll.jsonl"
    seeded = _record()  # the all-reduce of 4 KiB is "already measured": resume skips it
    out.write_text(seeded.model_dump_json() + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "validators.collectives", "--device", "cpu", "--sizes", "4K,64K", "--out", str(out),
        "--warmup", "1", "--repeats", "3", "--resume", "-q",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ms = load_measurements(out)
    assert len(ms) == len(BENCHMARKED) * 2
    assert {m.collective for m in ms} == set(BENCHMARKED)
    assert {m.bytes for m in ms} == {4096, 65536}
    by_key = {m.key: m for m in ms}
    assert by_key[seeded.key].device_name == "seed"  # kept, not measured again
    new = [m for m in ms if m.key != seeded.key]
    for m in new:
        assert (m.group_size, m.world_size, m.rank, m.backend, m.dtype) == (2, 2, 0, "gloo", DType.fp32)
        assert m.timer is CollectiveTimer.WALL and m.samples == 3 and m.median_us > 0
        assert m.events_median_us is None
        # Both ranks' calls were gathered: the transfer is the shorter rank's time, never above rank 0's.
        assert m.ranks_timed == 2 and m.transfer_us is not None and m.wait_us is not None
        assert 0 < m.transfer_us <= m.median_us and m.wait_us >= 0 and m.lead_us == 0
    # A fresh line per new case, appended after the seeded one.
    assert len(out.read_text().splitlines()) == 1 + len(new)


def test_bad_command_line_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert vc.main(["--out", str(tmp_path / "x.jsonl"), "--sizes", "4Q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sizes" in err[0]


def test_load_tolerates_a_torn_last_line_only(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    good = _record().model_dump_json()
    p.write_text(good + "\n" + good[:20])
    assert len(load_measurements(p)) == 1
    p.write_text(good[:20] + "\n" + good + "\n")
    with pytest.raises(CollectiveBenchError, match="line 1"):
        load_measurements(p)


def test_split_wait_takes_the_last_rank_to_arrive_as_the_transfer() -> None:
    # Rank 1 launched late for call 0 (rank 0 spun 40 us for it), rank 0 late for call 1.
    transfer, waits = vc.split_wait([[50.0, 10.0, 12.0], [10.0, 40.0, 12.5]]) or ([], [])
    assert transfer == [10.0, 10.0, 12.0]
    assert waits == [[40.0, 0.0, 0.0], [0.0, 30.0, 0.5]]
    assert vc.split_wait([[1.0], [1.0, 2.0]]) is None and vc.split_wait([]) is None


def test_transfer_split_summarises_the_calls_as_the_measurement_fields_of_its_names() -> None:
    # Transfer per call [10, 10, 12, 20]: median 11, IQR 14 - 10 (linear quantiles); mean wait per
    # call [20, 15, 0.25, 0]: median 7.625.
    split = vc.transfer_split([[50.0, 10.0, 12.0, 20.0], [10.0, 40.0, 12.5, 20.0]])
    assert split == pytest.approx((11.0, 4.0, 7.625, 2))
    assert vc.transfer_split([[1.0], [1.0, 2.0]]) == (None, None, None, None)
    record = _record(**split._asdict())
    assert (record.transfer_us, record.transfer_iqr_us, record.wait_us, record.ranks_timed) == split


def test_algbw_uses_the_gathered_size_for_all_gather() -> None:
    ag = _record(collective="all_gather", bytes=1_000_000, group_size=4, median_us=100.0)
    ar = _record(collective="all_reduce", bytes=1_000_000, group_size=4, median_us=100.0)
    assert ag.algbw_gbps == pytest.approx(40.0) and ar.algbw_gbps == pytest.approx(10.0)


def test_a_graph_without_collectives_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from opgraph.ir import save_graph

    path = tmp_path / "unsharded.json.gz"
    save_graph(_mlp_graph(8, 64, 128, layers=1), path)
    monkeypatch.setenv("WORLD_SIZE", "2")  # checked before any process group starts
    assert vc.main(["--out", str(tmp_path / "x.jsonl"), "--graph", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no collective" in err[0] and "unsharded.json.gz" in err[0]


def test_an_unreadable_measurements_file_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(vc.CollectiveBenchError, match="cannot read the measurements") as info:
        vc.load_measurements(tmp_path)  # a folder, not a file
    assert info.value.where == str(tmp_path)
