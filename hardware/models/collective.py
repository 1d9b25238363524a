"""Alpha-beta cost of collectives: steps x link latency + bytes on the wire / link bandwidth.

The one formula for collectives: cost models use :class:`AlphaBetaCollectiveModel` for their
collective ops, and the simulator costs a collective that a model declines with it too.

``Collective.bytes`` is the buffer **one rank passes in** (the tensor-parallel transform sets it to
the size of the collective's input tensor on one rank). What that buffer is, and what a ring moves
per rank over its link (NCCL's algorithms; ``g`` ranks, ``B = bytes``):

============== ================================= ============ =====================
collective     ``bytes`` is                      ring steps   bytes sent per rank
============== ================================= ============ =====================
all_reduce     the whole buffer (in = out)       2 (g-1)      2 (g-1)/g x B
reduce_scatter the whole buffer (out: B/g)       g-1          (g-1)/g x B
all_gather     this rank's shard (out: g x B)    g-1          (g-1) x B
all_to_all     the send buffer (B/g to each)     g-1          (g-1)/g x B
broadcast      the buffer                        g-1          B (pipelined)
send_recv      the message                       1            B
============== ================================= ============ =====================

In NCCL's performance notes the size ``S`` of all_gather is the gathered output (``S = g x B``),
so all_gather moves ``(g-1)/g x S`` there: the same bytes. A (double binary) tree all-reduce takes
``2 ceil(log2 g)`` steps but moves ``2 x B``; ``auto`` picks the faster, so small messages go by
tree and large ones by ring, as NCCL's tuner does. The link reaches ``link_efficiency`` of its
bandwidth, and a collective is a kernel, so the device's launch latency is added.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from hardware.base import Bound, Cost, CostModelError, UncostedOpError
from hardware.spec import HardwareSpec
from opgraph.ir import Collective, CollectiveKind, OpBase
from opgraph.ir.tensor import FrozenModel


class CollectiveParams(FrozenModel):
    """Assumptions of the alpha-beta model."""

    algorithm: Literal["ring", "tree", "auto"] = "auto"
    """Ring, tree (all-reduce only), or the faster of the two."""
    link_efficiency: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Fraction of the link's bandwidth a collective reaches (NCCL bus bandwidth / link peak)."""
    bandwidth: Annotated[float, Field(gt=0)] | None = None
    """Override of the per-direction link bandwidth, bytes/s."""
    latency_us: Annotated[float, Field(ge=0)] | None = None
    """Override of the per-step latency, microseconds."""
    include_launch: bool = True
    """Add the device's kernel launch latency (the collective is a kernel)."""


def ring_factors(kind: CollectiveKind, group_size: int) -> tuple[int, float]:
    """(latency steps, multiplier of ``Collective.bytes``) of the ring algorithm for ``kind`` over
    ``group_size`` ranks: the table of the module docstring."""
    g = group_size
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * (g - 1), 2 * (g - 1) / g
    if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
        return g - 1, (g - 1) / g
    if kind is CollectiveKind.ALL_GATHER:
        return g - 1, float(g - 1)
    if kind is CollectiveKind.BROADCAST:
        return g - 1, 1.0
    return 1, 1.0


class AlphaBetaCollectiveModel:
    """Costs :class:`~opgraph.ir.Collective` ops on the device's interconnect; other ops are uncosted.

    Uses NVLink/xGMI when the device has a direct link, else PCIe. Options are the fields of
    :class:`CollectiveParams`.
    """

    name = "collective"

    def __init__(self, params: CollectiveParams | None = None, **options: object) -> None:
        try:
            base = params or CollectiveParams()
            self.params = base.model_validate({**base.model_dump(), **options}) if options else base
        except ValidationError as exc:
            raise CostModelError(f"bad option for the collective model: {exc.errors()[0]['msg']}") from None

    def link(self, hw: HardwareSpec) -> tuple[float, float, str]:
        """(bandwidth bytes/s, per-step latency s, link name) used on ``hw``."""
        ic = hw.interconnect
        if self.params.bandwidth is not None:
            bw, lat, name = self.params.bandwidth, ic.latency_us or ic.pcie_latency_us, ic.name or "link"
        elif ic.bandwidth > 0:
            bw, lat, name = ic.bandwidth, ic.latency_us, ic.name or "device link"
        elif ic.pcie_bandwidth > 0:
            bw, lat, name = ic.pcie_bandwidth, ic.pcie_latency_us, "PCIe"
        else:
            raise UncostedOpError(
                f"hardware {hw.name!r} has no interconnect bandwidth for collectives",
                hint="set interconnect.bandwidth or interconnect.pcie_bandwidth in its hardware file",
            )
        if self.params.latency_us is not None:
            lat = self.params.latency_us
        return bw, lat * 1e-6, name

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """Latency steps plus bytes over the achievable link bandwidth, plus the kernel launch."""
        if not isinstance(op, Collective):
            raise UncostedOpError(f"the collective model costs only collectives, not {getattr(op, 'kind', op)}")
        g = op.group_size
        if g == 1:
            return Cost(0.0, Bound.FREE, detail="group of one rank: no communication")
        bw, lat, link = self.link(hw)
        rate = bw * self.params.link_efficiency
        steps, factor = ring_factors(op.collective, g)
        ring_lat, ring_bw = steps * lat, factor * op.bytes / rate
        algo = "ring"
        lat_s, bw_s = ring_lat, ring_bw
        if op.collective is CollectiveKind.ALL_REDUCE and self.params.algorithm != "ring":
            # Double binary tree: log-depth latency, but each rank moves the whole buffer twice.
            tree_lat, tree_bw = 2 * math.ceil(math.log2(g)) * lat, 2 * op.bytes / rate
            if self.params.algorithm == "tree" or tree_lat + tree_bw < ring_lat + ring_bw:
                algo, lat_s, bw_s = "tree", tree_lat, tree_bw
        launch = hw.launch_latency_us * 1e-6 if self.params.include_launch else 0.0
        seconds = lat_s + bw_s + launch
        bound = Bound.LINK if bw_s >= lat_s + launch else Bound.LAUNCH
        return Cost(
            seconds,
            bound,
            memory_s=bw_s,
            efficiency=self.params.link_efficiency,
            detail=f"{algo} {op.collective.value} over {g} ranks on {link}",
        )
