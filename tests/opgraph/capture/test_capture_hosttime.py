"""Host time between ops measured at capture (``--host-timing``) and its use by the simulator."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hardware import RooflineModel, load_hardware
from opgraph.capture import capture
from opgraph.capture.hosttime import BLOCK_RANGE, align_profile, attribute_gaps, carry_host_gaps
from opgraph.cli.app import app
from opgraph.ir import load_graph
from simulators import HostConfig, HostMode, SimulationConfig, simulate
from validators.configs import unique_configs

SLEEP_S = 0.02


class Toy(torch.nn.Module):
    """Embedding, two linears, and Python that sleeps between them (plus a folded view)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.a = torch.nn.Linear(16, 16, bias=False)
        self.b = torch.nn.Linear(16, 16, bias=False)

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        h = self.a(self.emb(input_ids))
        time.sleep(SLEEP_S)
        out: torch.Tensor = self.b(h.view(-1, 16))
        return out


class Fickle(Toy):
    """Makes one more op on its first call than on later calls."""

    calls = 0

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        Fickle.calls += 1
        h = self.emb(input_ids)
        if Fickle.calls == 1:
            h = h * 2
        out: torch.Tensor = self.a(h)
        return out


def test_python_between_ops_lands_on_the_next_op() -> None:
    g = capture(Toy(), seq_len=4, host_timing=True)
    gaps = [o.host_gap_us for o in g.ops]
    assert [o.kind.value for o in g.ops] == ["embedding", "gemm", "gemm"]
    assert all(x is not None and x >= 0 for x in gaps)
    assert gaps[2] >= 0.95 * SLEEP_S * 1e6  # the sleep (and the folded view) is before the second linear
    assert gaps[1] < SLEEP_S * 1e6
    md = g.metadata.capture
    assert md["host_timing_us"] == pytest.approx(sum(x or 0 for x in gaps), abs=0.1)
    assert md["host_timing_cpu"] and float(md["host_timing_clock_overhead_us"]) >= 0


def test_host_timing_changes_nothing_else(tiny_config: str) -> None:
    plain = capture(tiny_config, phase="decode", batch=2, kv_len=16)
    timed = capture(tiny_config, phase="decode", batch=2, kv_len=16, host_timing=True)
    assert all(o.host_gap_us is None for o in plain.ops)
    assert all(o.host_gap_us is not None for o in timed.ops)
    strip = [o.model_copy(update={"host_gap_us": None}) for o in timed.ops]
    assert strip == list(plain.ops) and timed.edges == plain.edges
    # Replay configs do not split on host time.
    assert [c.key for c in unique_configs(timed)] == [c.key for c in unique_configs(plain)]


def test_profiler_times_the_calls() -> None:
    g = capture(Toy(), seq_len=4, host_timing=True)
    assert g.metadata.capture["host_timing_from"] == "profiler"


def test_unprofilable_phase_falls_back_to_the_python_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph.capture.hosttime as hosttime

    def refuse(*args: Any) -> Any:
        return None  # the profile does not line up with the recording

    monkeypatch.setattr(hosttime, "align_profile", refuse)
    g = capture(Toy(), seq_len=4, host_timing=True)
    assert str(g.metadata.capture["host_timing_from"]).startswith("python clock")
    gaps = [o.host_gap_us or 0.0 for o in g.ops]
    assert gaps[2] >= 0.95 * SLEEP_S * 1e6 and gaps[1] < SLEEP_S * 1e6


def test_runs_that_do_not_line_up_are_an_error() -> None:
    from opgraph.capture.sources import CaptureError

    with pytest.raises(CaptureError, match="same aten calls"):
        capture(Fickle(), seq_len=4, host_timing=True)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1e5), st.floats(0, 1e5), st.one_of(st.none(), st.integers(0, 5))),
        min_size=1,
        max_size=30,
    ),
    st.floats(0, 1e4),
)
def test_attribution_conserves_time(calls: list[tuple[float, float, int | None]], clock: float) -> None:
    samples = [x for gap, own, _ in calls for x in (gap, own)]
    owners = [op for _, _, op in calls]
    out = attribute_gaps(samples, owners, clock)
    assert set(out) == {op for op in owners if op is not None}
    assert all(v >= 0 for v in out.values())
    # Counted: everything up to the last owned call, except an owned call's gap when the call
    # before it (folded calls aside) belongs to the same op (the Python inside an op: replay's).
    last = max((k for k, op in enumerate(owners) if op is not None), default=-1)
    raw, counted, previous, pending, pending_calls = 0.0, 0, None, 0.0, 0
    for gap, own, op in calls[: last + 1]:
        pending += gap + (own if op is None else 0.0)
        pending_calls += 1
        if op is not None:
            if op != previous:
                raw += pending
                counted += pending_calls
            pending, pending_calls, previous = 0.0, 0, op
    total = sum(out.values())
    assert raw - counted * clock - 1e-6 * max(1.0, raw) <= total <= raw + 1e-6 * max(1.0, raw)
    if clock == 0:
        assert total == pytest.approx(raw, rel=1e-9, abs=1e-6)


def test_attribution_example() -> None:
    # calls: view (folded), mm of op 0, python, add of op 1, python, mul of op 1 (inside op 1), view (trailing)
    samples = [5, 2, 10, 4, 30, 4, 7, 4, 3, 1]
    out = attribute_gaps(samples, [None, 0, 1, 1, None], clock=1)
    assert out == {0: 5 + 2 + 10 - 2, 1: 30 - 1}


def test_eager_simulation_adds_framework_time() -> None:
    g = capture(Toy(), seq_len=4, host_timing=True)
    hw = load_hardware("h100")
    eager = SimulationConfig.standard(1, policy="stream", host=HostConfig(mode=HostMode.EAGER))
    without = eager.model_copy(update={"host": HostConfig(mode=HostMode.EAGER, framework=False)})
    with_fw = simulate(g, hw, RooflineModel(), eager)
    no_fw = simulate(g, hw, RooflineModel(), without)
    total = sum(o.host_gap_us or 0 for o in g.ops)
    # Three tiny ops: the run is host-bound, so the framework time adds up in full.
    assert with_fw.makespan_us - no_fw.makespan_us == pytest.approx(total, rel=0.02)
    assert any("framework time" in n for n in with_fw.notes)
    assert not any("framework time" in n for n in no_fw.notes)


def test_cli_host_timing(tmp_path: Path, tiny_config: str) -> None:
    out = tmp_path / "g.json"
    r = CliRunner().invoke(app, ["capture", tiny_config, "--seq-len", "4", "--host-timing", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "host time between ops" in r.output
    g = load_graph(out)
    assert all(o.host_gap_us is not None for o in g.ops)
    sim = CliRunner().invoke(app, ["simulate", str(out), "--hardware", "h100"])
    assert sim.exit_code == 0, sim.output
    assert "ms of framework time between ops" in sim.output
    off = CliRunner().invoke(app, ["simulate", str(out), "--hardware", "h100", "--no-framework-time"])
    assert off.exit_code == 0 and "framework time" not in off.output


class _Range:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end


class _Ev:
    """A profiler ``FunctionEvent`` as :func:`align_profile` reads it."""

    def __init__(self, name: str, start: float, end: float, children: list[_Ev] | None = None) -> None:
        self.name, self.time_range, self.cpu_children = name, _Range(start, end), children or []


def test_align_profile_matches_recorded_calls_in_order() -> None:
    # linear -> t (-> transpose), matmul -> mm (-> empty inside its meta kernel); then a view.
    mm = _Ev("aten::mm", 22, 30, [_Ev("aten::empty", 25, 26)])
    linear = _Ev(
        "aten::linear",
        15,
        31,
        [_Ev("aten::t", 16, 18, [_Ev("aten::transpose", 16, 17)]), _Ev("aten::matmul", 20, 30, [mm])],
    )
    view = _Ev("aten::view", 40, 41)
    block = _Ev(BLOCK_RANGE, 10, 50, [view, linear])  # children in any order
    events = [block, linear, view, mm]
    targets = ["aten.t.default", "aten.mm.default", "aten.view.default"]
    calls = align_profile(events, [None, 7, None], targets)
    assert calls == [(5, 16, 7), (9, 1, None)]
    # A recorded call the profile does not have: no alignment.
    assert align_profile(events, [None, 7, None, 8], [*targets, "aten.empty.memory_format"]) is None


def test_carry_host_gaps_to_another_capture_of_the_phase(tiny_config: str) -> None:
    timed = capture(tiny_config, seq_len=4, host_timing=True)
    plain = capture(tiny_config, seq_len=4)
    carried = carry_host_gaps(timed, plain)
    assert [o.host_gap_us for o in carried.ops] == [o.host_gap_us for o in timed.ops]
    assert carried.metadata.capture["host_timing_us"] == timed.metadata.capture["host_timing_us"]
    assert carried.edges == plain.edges
    with pytest.raises(ValueError, match="differ op for op"):
        carry_host_gaps(timed, capture(tiny_config, seq_len=4, layers=1))


def test_timings_taken_at_several_moments_combine_per_op() -> None:
    from opgraph.capture.hosttime import HostTiming, median_timing

    def timing(gaps: dict[int, float]) -> HostTiming:
        return HostTiming(gaps, calls=5, runs=3, clock_overhead_us=0.5, overhead_source="profiler", host="cpu")

    out = median_timing([timing({0: 1.0, 1: 10.0}), timing({0: 3.0, 1: 20.0}), timing({0: 2.0})])
    assert out.gaps_us == {0: 2.0, 1: 10.0}  # an op one timing lacks counts as 0 there
    assert out.runs == 9 and out.calls == 5 and out.total_us == 12.0
    with pytest.raises(ValueError, match="no host timings"):
        median_timing([])
