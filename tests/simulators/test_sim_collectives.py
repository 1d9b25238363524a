"""One collective formula: every kind through every path, against NCCL's bus-bandwidth conventions.

The reference below is written from NCCL's performance notes (``doc/PERFORMANCE.md``), not from
the model: a collective of size ``S`` reaches ``algbw = S / t`` and ``busbw = algbw x factor``, with
``S`` the gathered output for all_gather, the whole input for reduce_scatter and the buffer for the
rest. ``Collective.bytes`` is what one rank passes in, so for all_gather ``S = g x bytes``.
"""

from __future__ import annotations

import pytest
from sim_graphs import hw

from hardware import AlphaBetaCollectiveModel, FormulaModel, RooflineModel, UncostedOpError, load_hardware
from hardware.base import Cost
from hardware.spec import HardwareSpec
from opgraph.ir import Collective, CollectiveKind, OpBase, OpGraph
from simulators import FixedCostModel, cost_problem

H100 = load_hardware("h100")
PCIE_ONLY = H100.model_copy(update={"interconnect": H100.interconnect.model_copy(update={"bandwidth": 0.0})})
"""An H100 without NVLink: collectives go over PCIe."""
MiB = 2**20


def nccl_ring_seconds(kind: CollectiveKind, nbytes: int, g: int, busbw: float, alpha_s: float) -> float:
    """Ring time from NCCL's conventions: ``factor x S / busbw`` plus one latency per ring step."""
    size = {CollectiveKind.ALL_GATHER: g * nbytes}.get(kind, nbytes)  # NCCL's S
    factor = {
        CollectiveKind.ALL_REDUCE: 2 * (g - 1) / g,
        CollectiveKind.REDUCE_SCATTER: (g - 1) / g,
        CollectiveKind.ALL_GATHER: (g - 1) / g,
        CollectiveKind.ALL_TO_ALL: (g - 1) / g,
        CollectiveKind.BROADCAST: 1.0,
        CollectiveKind.SEND_RECV: 1.0,
    }[kind]
    steps = {CollectiveKind.ALL_REDUCE: 2 * (g - 1), CollectiveKind.SEND_RECV: 1}.get(kind, g - 1)
    return factor * size / busbw + steps * alpha_s


class NoCollectives(FixedCostModel):
    """Fixed times for everything but collectives, which it declines (the simulator falls back)."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        if isinstance(op, Collective):
            raise UncostedOpError("no collective formula here")
        return super().estimate(op, hw)


def simulator_seconds(op: Collective, hw: HardwareSpec) -> float:
    """The collective's time as the simulator costs it when the cost model declines it."""
    problem, _, _ = cost_problem(OpGraph(ops=(op,)), NoCollectives(default_us=1.0), hw)
    assert not problem.uncosted
    return problem.dur_us[0] * 1e-6


KINDS = list(CollectiveKind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("g", [2, 4, 8])
def test_ring_model_matches_nccl_conventions(kind: CollectiveKind, g: int) -> None:
    nbytes = 64 * MiB
    model = AlphaBetaCollectiveModel(algorithm="ring")
    got = model.estimate(Collective(id=0, collective=kind, bytes=nbytes, group_size=g), H100).seconds
    ic = H100.interconnect
    want = nccl_ring_seconds(kind, nbytes, g, ic.bandwidth * model.params.link_efficiency, ic.latency_us * 1e-6)
    assert got == pytest.approx(want + H100.launch_latency_us * 1e-6, rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("nbytes", "g"), [(64 * MiB, 8), (4096, 2), (3 * MiB, 4)])
@pytest.mark.parametrize("device", ["h100", "pcie-only"])
def test_every_path_gives_the_same_time(kind: CollectiveKind, nbytes: int, g: int, device: str) -> None:
    # The case is 64 MiB all_gather over 8 ranks: the simulator once said 144.5 us and the
    # cost models 1057.9 us.
    spec = H100 if device == "h100" else PCIE_ONLY
    op = Collective(id=0, collective=kind, bytes=nbytes, group_size=g)
    times = {
        "collective model": AlphaBetaCollectiveModel().estimate(op, spec).seconds,
        "roofline": RooflineModel().estimate(op, spec).seconds,
        "formula": FormulaModel(reference="h100").estimate(op, spec).seconds,
        "simulator fallback": simulator_seconds(op, spec),
    }
    assert len({round(t, 15) for t in times.values()}) == 1, times
    if nbytes == 64 * MiB and kind is CollectiveKind.ALL_GATHER and device == "h100":
        # Seven ring steps, each rank forwarding 7 shards of 64 MiB over NVLink: about a millisecond.
        assert 0.8e-3 < times["simulator fallback"] < 1.5e-3


def test_a_group_of_one_rank_is_free_on_every_path() -> None:
    op = Collective(id=0, collective=CollectiveKind.ALL_REDUCE, bytes=MiB, group_size=1)
    assert AlphaBetaCollectiveModel().estimate(op, H100).seconds == 0.0
    assert simulator_seconds(op, H100) == 0.0


def test_no_link_leaves_the_collective_uncosted() -> None:
    op = Collective(id=0, collective=CollectiveKind.ALL_REDUCE, bytes=MiB, group_size=2)
    problem, _, _ = cost_problem(OpGraph(ops=(op,)), NoCollectives(default_us=1.0), hw(link_gbps=0.0))
    assert [u.op_id for u in problem.uncosted] == [0]
    assert problem.uncosted[0].reason == "no collective formula here"


def test_tensor_parallel_fills_bytes_with_the_input_of_one_rank() -> None:
    # The convention the formula relies on, as the TP transform writes it.
    from opgraph.capture import capture
    from opgraph.transforms import shard_tensor_parallel

    graph = shard_tensor_parallel(capture("llama-3.1-70b", phase="decode", batch=8, kv_len=2048, layers=1), 2)
    seen = set()
    for op in graph.ops:
        if not isinstance(op, Collective):
            continue
        seen.add(op.collective)
        (inp,), (out,) = op.inputs, op.outputs
        assert op.bytes == inp.nbytes
        gathered = op.group_size if op.collective is CollectiveKind.ALL_GATHER else 1
        assert out.nbytes == gathered * op.bytes
    assert seen == {CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER}
